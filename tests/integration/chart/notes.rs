//! The install notes (NOTES.txt): pasteable, and saying what the install left out.

use std::process::Command;

use super::{CHART, EXTERNAL_ETCD, KUBE_VERSION, floor_version, helm};

/// The chart's install notes, rendered. `helm template` leaves NOTES.txt out (and `helm install
/// --dry-run` takes no `--kube-version`): a copy of the chart renders it as a manifest, through
/// tpl, as the YAML block `notes`, whose value is the notes' text.
struct Notes {
    _copy: tempfile::TempDir,
    chart: std::path::PathBuf,
}

impl Notes {
    fn new() -> Self {
        let copy = tempfile::tempdir().unwrap();
        let chart = copy.path().join("podlock");
        let copied = Command::new("cp")
            .arg("-r")
            .arg(CHART)
            .arg(&chart)
            .status()
            .unwrap();
        assert!(copied.success());
        std::fs::copy(chart.join("templates/NOTES.txt"), chart.join("notes.txt")).unwrap();
        let notes = "notes: |\n{{ tpl (.Files.Get \"notes.txt\") . | indent 2 }}\n";
        std::fs::write(chart.join("templates/zz-notes.yaml"), notes).unwrap();
        Notes { _copy: copy, chart }
    }

    /// The notes' text for Kubernetes `version`, with `extra` arguments.
    fn render(&self, version: &str, extra: &[&str]) -> String {
        let mut args = vec![
            "template",
            "podlock",
            self.chart.to_str().unwrap(),
            "-n",
            "podlock",
        ];
        args.extend([
            "--kube-version",
            version,
            "--show-only",
            "templates/zz-notes.yaml",
        ]);
        args.extend(EXTERNAL_ETCD);
        args.extend_from_slice(extra);
        let (ok, out, err) = helm(&args);
        assert!(ok, "{err}");
        let doc: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        doc["notes"].as_str().expect("the notes").to_string()
    }
}

/// Where `text`, pasted into a shell, opens a heredoc that no line closes: each `<<WORD` (or
/// `<<'WORD'`, `<<"WORD"`) must be followed by a line equal to WORD, at column 0. `<<-`, which
/// takes a tab-indented terminator, counts as unclosed: a terminal's paste keeps no tabs.
fn unclosed_heredocs(text: &str) -> Vec<String> {
    let opener = regex::Regex::new(r#"<<(-?)\s*['"]?([A-Za-z_][A-Za-z0-9_]*)"#).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut unclosed = vec![];
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let opened: Vec<_> = (opener.captures_iter(line))
            .filter(|c| !line[..c.get(0).unwrap().start()].ends_with('<')) // <<<: a here-string
            .map(|c| (c[1].to_string(), c[2].to_string()))
            .collect();
        i += 1;
        for (dash, word) in opened {
            let closed = lines[i..].iter().position(|l| *l == word);
            match closed {
                Some(at) if dash.is_empty() => i += at + 1,
                _ => {
                    unclosed.push(format!("{line:?} opens {word}, which no line {word:?} ends"));
                    i = lines.len();
                }
            }
        }
    }
    unclosed
}

/// The install notes' commands can be pasted as they are: every heredoc they open is closed.
#[test]
fn the_notes_close_every_heredoc_they_open() {
    // The check finds the notes' old fault: a terminator indented with the command.
    let indented = "  kubectl apply -f - <<YAML\n  kind: X\n  YAML\n  kubectl get x\n";
    assert_eq!(unclosed_heredocs(indented).len(), 1);
    assert_eq!(unclosed_heredocs("cat <<-EOF\n\tx\n\tEOF\n").len(), 1);
    assert!(unclosed_heredocs("cat <<'EOF'\nx\nEOF\ncat <<<x\n").is_empty());
    let notes = Notes::new();
    let floor = floor_version();
    let bundled = ["--set", "etcd.bundled.enabled=true"];
    for (version, extra) in [(KUBE_VERSION, &[][..]), (floor.as_str(), &bundled[..])] {
        let text = notes.render(version, extra);
        let opened = text.matches("<<").count();
        assert!(opened > 0, "the notes open no heredoc any more? {text}");
        let unclosed = unclosed_heredocs(&text);
        assert!(
            unclosed.is_empty(),
            "{version} {extra:?}: {unclosed:?} in\n{text}"
        );
        eprintln!("the notes for {version} {extra:?}: {opened} heredoc(s), each closed");
    }
}

/// Where the Secret policy cannot be rendered, the install notes say what that costs.
#[test]
fn the_notes_say_when_the_secret_policy_is_left_out() {
    let notes = Notes::new();
    let render = |version: &str, extra: &[&str]| notes.render(version, extra);
    let left_out = "podlock-operator-secrets was left out";
    let floor = floor_version();
    // Every admitted version serves the policy's kind by default.
    assert!(!render(&floor, &[]).contains(left_out));
    assert!(!render(KUBE_VERSION, &[]).contains(left_out));
    let no_policy = ["--api-versions", "v1/Pod"]; // a cluster whose discovery lacks the kind
    for version in [floor.as_str(), KUBE_VERSION] {
        let text = render(version, &no_policy);
        assert!(text.contains(left_out), "{text}");
        let off = ["--api-versions", "v1/Pod", "--set", "operator.secretPolicy=false"];
        assert!(!render(version, &off).contains(left_out));
    }
}
