//! The command line: `spillway` serves; `spillway policy export|import` keeps policies as
//! code, so they can live in git and be restored after losing Redis.

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::{
    audit::Actor,
    auth::{password, people},
    domain::{
        Policy, PolicyError,
        people::{KeyRole, Role},
    },
    store::{Store, policies::document},
};

/// What the command line asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Serve,
    Export {
        format: Format,
        output: Option<PathBuf>,
    },
    Import {
        file: PathBuf,
    },
    /// `user add|set-password|set-role|remove|list`, `key add|list|revoke`.
    People(PeopleCommand),
    Demo(crate::demo::DemoOptions),
    Help,
}

/// Managing users and API keys from the command line.
#[derive(Debug, PartialEq, Eq)]
pub enum PeopleCommand {
    UserAdd {
        name: String,
        role: Role,
        password_stdin: bool,
    },
    UserSetPassword {
        name: String,
        password_stdin: bool,
    },
    UserSetRole {
        name: String,
        role: Role,
    },
    UserRemove {
        name: String,
    },
    UserList,
    KeyAdd {
        name: String,
        role: KeyRole,
    },
    KeyList,
    KeyRevoke {
        id: String,
    },
}

/// File format of an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Toml,
}

pub const USAGE: &str = "usage:
  spillway                                   serve (configuration from the environment)
  spillway policy export [--format json|toml] [--output FILE]
                                             write every policy, with overrides, as one document
  spillway policy import FILE                apply a document written by export (JSON or TOML),
                                             validated as a whole: all of it or nothing
  spillway user add NAME [--role admin|support|viewer] [--password-stdin]
                                             add a user (role viewer by default); without
                                             --password-stdin a random password is printed once
  spillway user set-password NAME [--password-stdin]
  spillway user set-role NAME admin|support|viewer
  spillway user remove NAME
  spillway user list
  spillway key add NAME [--role service|admin]  create an API key (printed once)
  spillway key list
  spillway key revoke ID
  spillway demo [--url URL] [--seconds N]     synthetic traffic against the demo policy
                                             (service key from SPILLWAY_SERVICE_KEYS)";

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        [] | ["serve"] => Ok(Command::Serve),
        ["help" | "--help" | "-h"] => Ok(Command::Help),
        ["policy", "export", rest @ ..] => {
            let (mut format, mut output) = (Format::Json, None);
            let mut it = rest.iter();
            while let Some(arg) = it.next() {
                match *arg {
                    "--format" => {
                        format = match it.next() {
                            Some(&"json") => Format::Json,
                            Some(&"toml") => Format::Toml,
                            other => {
                                return Err(format!(
                                    "--format: expected json or toml, got {other:?}"
                                ));
                            }
                        }
                    }
                    "--output" | "-o" => {
                        output = Some(PathBuf::from(
                            it.next().ok_or("--output: a file name is missing")?,
                        ))
                    }
                    other => return Err(format!("unknown argument {other:?}")),
                }
            }
            Ok(Command::Export { format, output })
        }
        ["policy", "import", file] => Ok(Command::Import {
            file: PathBuf::from(file),
        }),
        ["user", "add", name, rest @ ..] => {
            let (mut role, mut password_stdin) = (Role::Viewer, false);
            let mut it = rest.iter();
            while let Some(arg) = it.next() {
                match *arg {
                    "--role" => {
                        role = Role::parse(it.next().ok_or("--role: a role is missing")?)
                            .map_err(|m| format!("--role: {m}"))?
                    }
                    "--password-stdin" => password_stdin = true,
                    other => return Err(format!("unknown argument {other:?}")),
                }
            }
            Ok(Command::People(PeopleCommand::UserAdd {
                name: name.to_string(),
                role,
                password_stdin,
            }))
        }
        ["user", "set-password", name, rest @ ..] => match rest {
            [] | ["--password-stdin"] => Ok(Command::People(PeopleCommand::UserSetPassword {
                name: name.to_string(),
                password_stdin: !rest.is_empty(),
            })),
            _ => Err(format!("unknown arguments {rest:?}")),
        },
        ["user", "set-role", name, role] => Ok(Command::People(PeopleCommand::UserSetRole {
            name: name.to_string(),
            role: Role::parse(role).map_err(|m| format!("role: {m}"))?,
        })),
        ["user", "remove", name] => Ok(Command::People(PeopleCommand::UserRemove {
            name: name.to_string(),
        })),
        ["user", "list"] => Ok(Command::People(PeopleCommand::UserList)),
        ["key", "add", name, rest @ ..] => {
            let role = match rest {
                [] => KeyRole::Service,
                ["--role", r] => KeyRole::parse(r).map_err(|m| format!("--role: {m}"))?,
                _ => return Err(format!("unknown arguments {rest:?}")),
            };
            Ok(Command::People(PeopleCommand::KeyAdd {
                name: name.to_string(),
                role,
            }))
        }
        ["demo", rest @ ..] => {
            let (mut url, mut seconds) = ("http://127.0.0.1:3000".to_owned(), None);
            let mut it = rest.iter();
            while let Some(arg) = it.next() {
                match *arg {
                    "--url" => url = it.next().ok_or("--url: a URL is missing")?.to_string(),
                    "--seconds" => {
                        seconds = Some(
                            it.next()
                                .and_then(|s| s.parse().ok())
                                .ok_or("--seconds: a whole number is missing")?,
                        )
                    }
                    other => return Err(format!("unknown argument {other:?}")),
                }
            }
            Ok(Command::Demo(crate::demo::DemoOptions { url, seconds }))
        }
        ["key", "list"] => Ok(Command::People(PeopleCommand::KeyList)),
        ["key", "revoke", id] => Ok(Command::People(PeopleCommand::KeyRevoke {
            id: id.to_string(),
        })),
        _ => Err(format!("unknown command {:?}", args.join(" "))),
    }
}

/// Every policy as one document: `{"policies": {"<name>": <policy document>, ...}}`.
pub async fn export(store: &Store, format: Format) -> anyhow::Result<String> {
    let policies = store.list_policies().await?;
    let mut map = Map::new();
    for p in &policies {
        map.insert(p.name.to_string(), document(p));
    }
    let doc = serde_json::json!({ "policies": map });
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(&doc)? + "\n",
        Format::Toml => toml::to_string_pretty(&doc)?,
    })
}

/// Parses a whole export; the first invalid field stops everything.
pub fn parse_document(text: &str) -> Result<Vec<Policy>, PolicyError> {
    let doc: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(json_error) => toml::from_str::<Value>(text).map_err(|toml_error| {
            PolicyError::field(
                "file",
                format!("neither JSON ({json_error}) nor TOML ({toml_error})"),
            )
        })?,
    };
    let policies = doc
        .get("policies")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            PolicyError::field("policies", "is required: a table of policy name -> policy")
        })?;
    policies
        .iter()
        .map(|(name, body)| {
            Policy::from_document(name, body).map_err(|e| PolicyError {
                field: format!("policies.{name}.{}", e.field),
                message: e.message,
            })
        })
        .collect()
}

/// Applies a whole export atomically, and records it in the audit log. Returns how many
/// policies were written.
pub async fn import(store: &Store, text: &str) -> anyhow::Result<usize> {
    let policies = parse_document(text).map_err(|e| anyhow::anyhow!("nothing imported: {e}"))?;
    let written = store.import_policies(&policies).await?;
    let names: Vec<String> = policies.iter().map(|p| p.name.to_string()).collect();
    let _ = cli_actor()
        .record(
            store,
            crate::audit::Change {
                action: "policy.import",
                target: &names.join(","),
                after: serde_json::json!({ "policies": names }).to_string(),
                ..Default::default()
            },
        )
        .await;
    Ok(written)
}

/// The audit actor of the command line: `cli:<os user>`.
fn cli_actor() -> Actor {
    let who = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    Actor {
        name: format!("cli:{who}"),
        role: "admin".into(),
        ip: String::new(),
    }
}

fn read_password(from_stdin: bool) -> anyhow::Result<(String, bool)> {
    if !from_stdin {
        return Ok((password::generate_password(), true));
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok((line.trim_end_matches(['\n', '\r']).to_owned(), false))
}

fn date(ms: Option<i64>) -> String {
    crate::domain::time::utc_minutes(ms)
}

/// Runs a user or key command; returns what to print.
pub async fn people_command(store: &Store, command: PeopleCommand) -> anyhow::Result<String> {
    let actor = cli_actor();
    Ok(match command {
        PeopleCommand::UserAdd {
            name,
            role,
            password_stdin,
        } => {
            let (pw, generated) = read_password(password_stdin)?;
            let user = people::add_user(store, &actor, &name, role, &pw).await?;
            if generated {
                format!(
                    "added {} ({}) with password\n\n    {pw}\n\nIt is not shown again.\n",
                    user.username, user.role
                )
            } else {
                format!("added {} ({})\n", user.username, user.role)
            }
        }
        PeopleCommand::UserSetPassword {
            name,
            password_stdin,
        } => {
            let (pw, generated) = read_password(password_stdin)?;
            people::set_password(store, &actor, &name, &pw).await?;
            if generated {
                format!("new password for {name}:\n\n    {pw}\n\nTheir sessions have ended.\n")
            } else {
                format!("password of {name} changed; their sessions have ended\n")
            }
        }
        PeopleCommand::UserSetRole { name, role } => {
            people::set_role(store, &actor, &name, role).await?;
            format!("{name} is now {role}; their sessions have ended\n")
        }
        PeopleCommand::UserRemove { name } => {
            people::remove_user(store, &actor, &name).await?;
            format!("removed {name}\n")
        }
        PeopleCommand::UserList => {
            let mut out = String::new();
            for u in store.list_users().await? {
                out += &format!(
                    "{:<24} {:<8} created {}\n",
                    u.username.as_str(),
                    u.role.as_str(),
                    date(Some(u.created_at_ms))
                );
            }
            out
        }
        PeopleCommand::KeyAdd { name, role } => {
            let (record, secret) = people::create_key(store, &actor, &name, role).await?;
            format!(
                "created {} key {} (id {})\n\n    {secret}\n\nIt is not shown again.\n",
                record.role.as_str(),
                record.name,
                record.id
            )
        }
        PeopleCommand::KeyList => {
            let mut out = String::new();
            for k in store.list_api_keys().await? {
                let state = match k.revoked_at_ms {
                    Some(ms) => format!("revoked {}", date(Some(ms))),
                    None => "active".into(),
                };
                out += &format!(
                    "{}  {:<7} {:<24} {:<26} last used {}\n",
                    k.id,
                    k.role.as_str(),
                    k.name,
                    state,
                    date(k.last_used_ms)
                );
            }
            out
        }
        PeopleCommand::KeyRevoke { id } => {
            people::revoke_key(store, &actor, &id).await?;
            format!("revoked key {id}\n")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn commands_parse() {
        assert_eq!(parse(&args(&[])), Ok(Command::Serve));
        assert_eq!(
            parse(&args(&["policy", "export", "--format", "toml"])),
            Ok(Command::Export {
                format: Format::Toml,
                output: None
            })
        );
        assert_eq!(
            parse(&args(&["policy", "import", "p.json"])),
            Ok(Command::Import {
                file: "p.json".into()
            })
        );
        assert!(parse(&args(&["policy", "export", "--format", "xml"])).is_err());
        assert!(parse(&args(&["frobnicate"])).is_err());
        assert_eq!(
            parse(&args(&[
                "user",
                "add",
                "ann",
                "--role",
                "support",
                "--password-stdin"
            ])),
            Ok(Command::People(PeopleCommand::UserAdd {
                name: "ann".into(),
                role: Role::Support,
                password_stdin: true
            }))
        );
        assert!(parse(&args(&["user", "add", "ann", "--role", "root"])).is_err());
        assert_eq!(
            parse(&args(&["key", "add", "billing", "--role", "admin"])),
            Ok(Command::People(PeopleCommand::KeyAdd {
                name: "billing".into(),
                role: KeyRole::Admin
            }))
        );
    }

    #[test]
    fn a_bad_policy_anywhere_refuses_the_whole_document() {
        let text = r#"{"policies": {
            "good": {"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 1, "window_ms": 1000}]},
            "bad": {"rules": [{"name": "r", "algorithm": "fixed_window", "limit": 0, "window_ms": 1000}]}}}"#;
        let err = parse_document(text).unwrap_err();
        assert_eq!(err.field, "policies.bad.rules[0].limit");
    }

    #[test]
    fn toml_and_json_exports_read_back_the_same() {
        let policy = crate::service::policies::demo_policy();
        let mut map = Map::new();
        map.insert("demo".into(), document(&policy));
        let doc = serde_json::json!({ "policies": map });
        let from_json = parse_document(&serde_json::to_string(&doc).unwrap()).unwrap();
        let from_toml = parse_document(&toml::to_string_pretty(&doc).unwrap()).unwrap();
        assert_eq!(from_json, vec![policy.clone()]);
        assert_eq!(from_toml, vec![policy]);
    }
}
