//! The command line: `spillway` serves; `spillway policy export|import` keeps policies as
//! code, so they can live in git and be restored after losing Redis.

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::{
    domain::{Policy, PolicyError},
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
    Help,
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
                                             validated as a whole: all of it or nothing";

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

/// Applies a whole export atomically. Returns how many policies were written.
pub async fn import(store: &Store, text: &str) -> anyhow::Result<usize> {
    let policies = parse_document(text).map_err(|e| anyhow::anyhow!("nothing imported: {e}"))?;
    Ok(store.import_policies(&policies).await?)
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
        let policy = crate::api::demo_policy();
        let mut map = Map::new();
        map.insert("demo".into(), document(&policy));
        let doc = serde_json::json!({ "policies": map });
        let from_json = parse_document(&serde_json::to_string(&doc).unwrap()).unwrap();
        let from_toml = parse_document(&toml::to_string_pretty(&doc).unwrap()).unwrap();
        assert_eq!(from_json, vec![policy.clone()]);
        assert_eq!(from_toml, vec![policy]);
    }
}
