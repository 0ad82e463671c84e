//! The command line: `spillway` serves; `spillway policy export|import` keeps policies as
//! code, so they can live in git and be restored after losing Redis.

pub mod backup;
pub mod demo;
pub mod plan;

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::{
    domain::{
        Policy, PolicyError,
        people::{KeyRole, Role},
    },
    service::audit::Actor,
    service::{Service, password},
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
    /// Checks Envoy domain files without a server.
    Validate {
        files: Vec<PathBuf>,
    },
    /// What a policy file would change, with a replay over the recorded checks.
    Plan {
        file: PathBuf,
        last_ms: i64,
    },
    /// Expected decisions of a policy file's rules, offline.
    Test {
        file: PathBuf,
        cases: PathBuf,
    },
    /// `user add|set-password|set-role|remove|list`, `key add|list|revoke`.
    People(PeopleCommand),
    Demo(crate::cli::demo::DemoOptions),
    /// `backup`, `restore`.
    State(backup::StateCommand),
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
    Toml,
}

/// The arguments as clap reads them (`spillway --help` shows this).
#[derive(clap::Parser)]
#[command(
    name = "spillway",
    version,
    about = "A rate limiter service backed by Redis, with an admin dashboard.",
    long_about = "A rate limiter service backed by Redis, with an admin dashboard.\n\n\
        Without a command it serves the API and the dashboard. Configuration comes from the \
        environment (REDIS_URL, SPILLWAY_*; see docs/settings.md) and Leptos.toml; every command \
        uses the same Redis."
)]
struct Args {
    #[command(subcommand)]
    command: Option<Top>,
}

#[derive(clap::Subcommand)]
enum Top {
    /// Serve the API and the dashboard (the default).
    Serve,
    /// Policies as code: export every policy, or import a whole document.
    Policy {
        #[command(subcommand)]
        command: PolicyArgs,
    },
    /// Dashboard users.
    User {
        #[command(subcommand)]
        command: UserArgs,
    },
    /// API keys for services (check endpoints) and automation (admin API).
    Key {
        #[command(subcommand)]
        command: KeyArgs,
    },
    /// Write what Spillway keeps (policies with their versions, users, API keys, alert
    /// rules) as one JSON file, for `restore`.
    Backup {
        /// Write to this file (mode 0600) instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Write a backup back. Refused over a Redis that holds any policy, user, key or alert
    /// rule, unless --replace.
    Restore {
        file: PathBuf,
        /// Replace whatever this Redis holds.
        #[arg(long)]
        replace: bool,
    },
    /// Synthetic traffic against the demo policy of a running server (about 55 checks a
    /// second; the service key comes from SPILLWAY_SERVICE_KEYS).
    Demo {
        /// The server to send checks to.
        #[arg(long, default_value = "http://127.0.0.1:3000")]
        url: String,
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(long)]
        seconds: Option<u64>,
    },
}

#[derive(clap::Subcommand)]
enum PolicyArgs {
    /// Write every policy, with its overrides, as one document.
    Export {
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
        /// Write to this file instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
    /// Apply a document written by export (JSON or TOML), validated as a whole: all of it
    /// or nothing.
    Import { file: PathBuf },
    /// Check Envoy domain files (envoyproxy/ratelimit's YAML) without a server, as a domains
    /// folder loads them: each domain once, every field valid. Exits 1 naming the file and
    /// field of each problem.
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// What a file (as import takes it) would change: each policy's fields against the
    /// stored ones, and a replay of its rules over the recorded checks. Exits 3 when a check
    /// would newly be denied, for CI pipelines.
    Plan {
        file: PathBuf,
        /// How far back to replay: 1h, 30m, 90s, or ms (at most a day).
        #[arg(long, default_value = "1h")]
        last: String,
    },
    /// Checks expected decisions (CASES, JSON or TOML: `[[cases]]` with `name`, `policy` and
    /// `checks` of `identifiers`, `expect = "allowed"|"denied"`, optional `at_ms`, `cost`,
    /// `rule`) against FILE's policies with the reference model, offline. Exits 1 naming
    /// each failed check.
    Test { file: PathBuf, cases: PathBuf },
}

#[derive(clap::Subcommand)]
enum UserArgs {
    /// Add a user; without --password-stdin a random password is printed once.
    Add {
        name: String,
        #[arg(long, default_value = "viewer", value_parser = parse_role)]
        role: Role,
        /// Read the password from standard input.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Set a user's password (ends every session of theirs).
    SetPassword {
        name: String,
        /// Read the password from standard input.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Change a user's role: admin, support or viewer.
    SetRole {
        name: String,
        #[arg(value_parser = parse_role)]
        role: Role,
    },
    /// Remove a user.
    Remove { name: String },
    /// List the users.
    List,
}

#[derive(clap::Subcommand)]
enum KeyArgs {
    /// Create an API key (printed once).
    Add {
        name: String,
        #[arg(long, default_value = "service", value_parser = parse_key_role)]
        role: KeyRole,
    },
    /// List the API keys (never the keys themselves).
    List,
    /// Revoke a key: refused everywhere within a second.
    Revoke { id: String },
}

fn parse_role(raw: &str) -> Result<Role, String> {
    Role::parse(raw)
}

fn parse_key_role(raw: &str) -> Result<KeyRole, String> {
    KeyRole::parse(raw)
}

/// Parses the arguments after the program name. `--help` and `--version` come back as the
/// error whose `exit()` prints them and exits 0; anything wrong, as the error that says what.
pub fn parse(args: &[String]) -> Result<Command, clap::Error> {
    use clap::Parser;
    let parsed =
        Args::try_parse_from(std::iter::once("spillway".to_owned()).chain(args.iter().cloned()))?;
    Ok(match parsed.command.unwrap_or(Top::Serve) {
        Top::Serve => Command::Serve,
        Top::Policy {
            command: PolicyArgs::Export { format, output },
        } => Command::Export { format, output },
        Top::Policy {
            command: PolicyArgs::Import { file },
        } => Command::Import { file },
        Top::Policy {
            command: PolicyArgs::Validate { files },
        } => Command::Validate { files },
        Top::Policy {
            command: PolicyArgs::Plan { file, last },
        } => Command::Plan {
            file,
            last_ms: plan::look_back_ms(&last).map_err(|m| {
                use clap::CommandFactory;
                Args::command().error(clap::error::ErrorKind::InvalidValue, m)
            })?,
        },
        Top::Policy {
            command: PolicyArgs::Test { file, cases },
        } => Command::Test { file, cases },
        Top::User { command } => Command::People(match command {
            UserArgs::Add {
                name,
                role,
                password_stdin,
            } => PeopleCommand::UserAdd {
                name,
                role,
                password_stdin,
            },
            UserArgs::SetPassword {
                name,
                password_stdin,
            } => PeopleCommand::UserSetPassword {
                name,
                password_stdin,
            },
            UserArgs::SetRole { name, role } => PeopleCommand::UserSetRole { name, role },
            UserArgs::Remove { name } => PeopleCommand::UserRemove { name },
            UserArgs::List => PeopleCommand::UserList,
        }),
        Top::Key { command } => Command::People(match command {
            KeyArgs::Add { name, role } => PeopleCommand::KeyAdd { name, role },
            KeyArgs::List => PeopleCommand::KeyList,
            KeyArgs::Revoke { id } => PeopleCommand::KeyRevoke { id },
        }),
        Top::Demo { url, seconds } => Command::Demo(crate::cli::demo::DemoOptions { url, seconds }),
        Top::Backup { output } => Command::State(backup::StateCommand::Backup { output }),
        Top::Restore { file, replace } => {
            Command::State(backup::StateCommand::Restore { file, replace })
        }
    })
}

/// Every policy as one document: `{"policies": {"<name>": <policy document>, ...}}`.
pub async fn export(service: &Service, format: Format) -> anyhow::Result<String> {
    let policies = service.stored_policies().await?;
    let mut map = Map::new();
    for p in &policies {
        map.insert(p.name.to_string(), p.document());
    }
    let doc = serde_json::json!({ "policies": map });
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(&doc)? + "\n",
        Format::Toml => toml::to_string_pretty(&doc)?,
    })
}

/// Parses a whole export, or envoyproxy/ratelimit configuration files (YAML documents with
/// a `domain`, several separated by `---`); the first invalid field stops everything.
pub fn parse_document(text: &str) -> Result<Vec<Policy>, PolicyError> {
    if let Some(domains) = envoy_documents(text)? {
        return Ok(domains);
    }
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
            Policy::from_document(name, body)
                .and_then(|p| crate::domain::policy::refuse_reserved(&p.name).map(|()| p))
                .map_err(|e| PolicyError {
                    field: format!("policies.{name}.{}", e.field),
                    message: e.message,
                })
        })
        .collect()
}

/// The policies of a file of Envoy domains, or `None` when the file is not one (every YAML
/// document an object with a `domain`).
fn envoy_documents(text: &str) -> Result<Option<Vec<Policy>>, PolicyError> {
    use serde::Deserialize;
    crate::service::envoy::refuse_deep_yaml(text).map_err(|message| PolicyError {
        field: "file".into(),
        message,
    })?;
    let mut docs = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        // Read as YAML's own value first: a key repeated in one mapping is refused there.
        let read = serde_yaml::Value::deserialize(document).map_err(|e| PolicyError {
            field: "file".into(),
            message: format!("is not valid YAML: {e}"),
        })?;
        match serde_json::to_value(read) {
            Ok(Value::Null) => {}
            Ok(v) if v.get("domain").is_some() && v.get("policies").is_none() => docs.push(v),
            _ => return Ok(None),
        }
    }
    if docs.is_empty() {
        return Ok(None);
    }
    let mut policies: Vec<Policy> = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let prefix = if docs.len() == 1 {
            String::new()
        } else {
            format!("documents[{i}].")
        };
        let named = |e: PolicyError| PolicyError {
            field: format!("{prefix}{}", e.field),
            message: e.message,
        };
        let domain = crate::domain::envoy::EnvoyDomain::from_value(doc).map_err(named)?;
        let policy = Policy::from_envoy(domain, crate::domain::FailureMode::Open).map_err(named)?;
        if let Some(j) = policies.iter().position(|p| p.name == policy.name) {
            return Err(named(PolicyError::field(
                "domain",
                format!("is also the domain of documents[{j}] (or maps to its policy name)"),
            )));
        }
        policies.push(policy);
    }
    Ok(Some(policies))
}

/// Applies a whole export atomically, and records it in the audit log. Returns how many
/// policies were written.
pub async fn import(service: &Service, text: &str) -> anyhow::Result<usize> {
    let policies = parse_document(text).map_err(|e| anyhow::anyhow!("nothing imported: {e}"))?;
    service
        .import_policies(&cli_actor(), policies)
        .await
        .map_err(|e| anyhow::anyhow!("nothing imported: {e}"))
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
pub async fn people_command(service: &Service, command: PeopleCommand) -> anyhow::Result<String> {
    let actor = cli_actor();
    Ok(match command {
        PeopleCommand::UserAdd {
            name,
            role,
            password_stdin,
        } => {
            let (pw, generated) = read_password(password_stdin)?;
            let user = service.add_user(&actor, &name, role, &pw).await?;
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
            service.set_password(&actor, &name, &pw).await?;
            if generated {
                format!("new password for {name}:\n\n    {pw}\n\nTheir sessions have ended.\n")
            } else {
                format!("password of {name} changed; their sessions have ended\n")
            }
        }
        PeopleCommand::UserSetRole { name, role } => {
            service.set_role(&actor, &name, role).await?;
            format!("{name} is now {role}; their sessions have ended\n")
        }
        PeopleCommand::UserRemove { name } => {
            service.remove_user(&actor, &name).await?;
            format!("removed {name}\n")
        }
        PeopleCommand::UserList => user_list(service).await?,
        PeopleCommand::KeyAdd { name, role } => {
            let (record, secret) = service.create_key(&actor, &name, role).await?;
            format!(
                "created {} key {} (id {})\n\n    {secret}\n\nIt is not shown again.\n",
                record.role.as_str(),
                record.name,
                record.id
            )
        }
        PeopleCommand::KeyList => key_list(service).await?,
        PeopleCommand::KeyRevoke { id } => {
            service.revoke_key(&actor, &id).await?;
            format!("revoked key {id}\n")
        }
    })
}

/// Every user, a line each: name, role, when created.
async fn user_list(service: &Service) -> anyhow::Result<String> {
    let mut out = String::new();
    for u in service.users().await? {
        out += &format!(
            "{:<24} {:<8} created {}\n",
            u.username.as_str(),
            u.role.as_str(),
            date(Some(u.created_at_ms))
        );
    }
    Ok(out)
}

/// Every API key, a line each: id, role, name, state, last use.
async fn key_list(service: &Service) -> anyhow::Result<String> {
    let mut out = String::new();
    for k in service.api_keys().await? {
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
    Ok(out)
}

/// `spillway policy validate FILE...`: what each file holds, or every problem found (file and
/// field), as the domains folder would load the files together.
/// A domain in several files is merged when `merge` (the server's setting).
pub fn validate(files: &[PathBuf], merge: bool) -> Result<String, String> {
    use crate::service::policies::read_envoy_files;
    let mut read = Vec::new();
    let mut problems = Vec::new();
    let mut out = String::new();
    for path in files {
        let name = path.display().to_string();
        match std::fs::read_to_string(path) {
            Err(e) => problems.push(format!("{name}: cannot be read: {e}")),
            Ok(text) => {
                let one = [(name.clone(), text)];
                match read_envoy_files(&one, merge) {
                    Ok(domains) => {
                        let names: Vec<String> =
                            domains.iter().map(|p| p.name.to_string()).collect();
                        out.push_str(&format!("ok {name}: {}\n", names.join(", ")));
                        read.extend(one);
                    }
                    Err(problem) => problems.push(problem),
                }
            }
        }
    }
    // Together: no domain in two files.
    if problems.is_empty()
        && let Err(problem) = read_envoy_files(&read, merge)
    {
        problems.push(problem);
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems.join("\n"))
    }
}

#[cfg(test)]
mod tests;
