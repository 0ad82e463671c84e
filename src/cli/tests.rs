use super::*;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn commands_parse() {
    let parse = |list: &[&str]| parse(&args(list)).map_err(|e| e.to_string());
    assert_eq!(parse(&[]), Ok(Command::Serve));
    assert_eq!(parse(&["serve"]), Ok(Command::Serve));
    assert_eq!(
        parse(&["policy", "export", "--format", "toml"]),
        Ok(Command::Export {
            format: Format::Toml,
            output: None
        })
    );
    assert_eq!(
        parse(&["policy", "import", "p.json"]),
        Ok(Command::Import {
            file: "p.json".into()
        })
    );
    assert!(parse(&["policy", "export", "--format", "xml"]).is_err());
    assert!(parse(&["frobnicate"]).is_err());
    // Help for every level is an answer, not an "unknown argument".
    for help in [
        &["--help"][..],
        &["user", "--help"],
        &["policy", "export", "--help"],
    ] {
        let error = super::parse(&args(help)).unwrap_err();
        assert_eq!(
            error.kind(),
            clap::error::ErrorKind::DisplayHelp,
            "{help:?}"
        );
    }
    assert_eq!(
        parse(&[
            "user",
            "add",
            "ann",
            "--role",
            "support",
            "--password-stdin"
        ]),
        Ok(Command::People(PeopleCommand::UserAdd {
            name: "ann".into(),
            role: Role::Support,
            password_stdin: true
        }))
    );
    assert!(parse(&["user", "add", "ann", "--role", "root"]).is_err());
    assert_eq!(
        parse(&["key", "add", "billing", "--role", "admin"]),
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
    map.insert("demo".into(), policy.document());
    let doc = serde_json::json!({ "policies": map });
    let from_json = parse_document(&serde_json::to_string(&doc).unwrap()).unwrap();
    let from_toml = parse_document(&toml::to_string_pretty(&doc).unwrap()).unwrap();
    assert_eq!(from_json, vec![policy.clone()]);
    assert_eq!(from_toml, vec![policy]);
}
