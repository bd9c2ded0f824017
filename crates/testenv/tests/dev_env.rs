//! `kok-dev-env` as `scripts/dev-env.sh` runs it: both clusters come up with the
//! examples applied, both operators connect, and it stops cleanly by itself.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use kube_on_kube_api::{Cluster, Machine};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::time::timeout;

/// Two control planes starting on a busy 2-core machine.
const UP_WITHIN: Duration = Duration::from_secs(300);
/// Runs this long once up: enough for the checks below, short for the suite.
const EXIT_AFTER_SECS: u64 = 20;
/// From "up" to exited: the run above plus stopping operators and clusters.
const EXITED_WITHIN: Duration = Duration::from_secs(EXIT_AFTER_SECS + 60);
const API_CALL: Duration = Duration::from_secs(15);

const BANNER: &str = "kube-on-kube dev environment is up";
const OPERATORS: [&str; 2] = ["kube-on-kube-operator", "node-operator"];

#[tokio::test]
async fn runs_both_operators_against_both_clusters_with_the_examples() {
    let program = Path::new(env!("CARGO_BIN_EXE_kok-dev-env"));
    // Cargo builds this package's binaries for its tests, not other packages'.
    let operators_dir = program.parent().expect("the binary is in a directory");
    for operator in OPERATORS {
        assert!(
            operators_dir.join(operator).is_file(),
            "{} is missing: build the operators first with `cargo build --workspace --bins` \
             (scripts/test.sh does)",
            operators_dir.join(operator).display()
        );
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");

    let mut child = Command::new(program)
        .arg("--exit-after")
        .arg(EXIT_AFTER_SECS.to_string())
        .arg("--dir")
        .arg(dir.path())
        .arg("--examples")
        .arg(&examples)
        .arg("--operators-dir")
        .arg(operators_dir)
        // Other tests may run operators on the default ports meanwhile.
        .arg("--meta-operator-http=127.0.0.1:0")
        .arg("--node-operator-http=127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A failed assertion unwinds through here and takes the environment
        // down with it; its own children die with it.
        .kill_on_drop(true)
        .spawn()
        .expect("start kok-dev-env");
    let (tx, mut lines) = mpsc::unbounded_channel();
    tokio::spawn(collect(
        child.stdout.take().expect("piped stdout"),
        "",
        tx.clone(),
    ));
    tokio::spawn(collect(
        child.stderr.take().expect("piped stderr"),
        "stderr: ",
        tx,
    ));
    let mut output = Vec::new();

    let up = timeout(UP_WITHIN, async {
        while let Some(line) = lines.recv().await {
            let found = line.contains(BANNER);
            output.push(line);
            if found {
                return true;
            }
        }
        false
    })
    .await;
    match up {
        Ok(true) => {}
        Ok(false) => panic!("kok-dev-env ended before it was up:\n{}", tail(&output)),
        Err(_) => panic!(
            "kok-dev-env not up within {UP_WITHIN:?}:\n{}",
            tail(&output)
        ),
    }

    let meta = client(&dir.path().join("meta.kubeconfig")).await;
    let clusters = timeout(
        API_CALL,
        Api::<Cluster>::all(meta).list(&ListParams::default()),
    )
    .await
    .expect("listing Clusters in time")
    .expect("list Clusters in the meta-cluster");
    let mut names: Vec<String> = clusters
        .iter()
        .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
        .collect();
    names.sort();
    assert_eq!(names, ["clusters/prod-east", "default/ci"]);

    let business = client(&dir.path().join("business.kubeconfig")).await;
    let machine = timeout(API_CALL, Api::<Machine>::all(business).get("worker-a1"))
        .await
        .expect("reading the Machine in time")
        .expect("the example Machine in the business cluster");
    assert_eq!(machine.spec.ip, "10.0.12.34");

    let rest = timeout(EXITED_WITHIN, async {
        while let Some(line) = lines.recv().await {
            output.push(line);
        }
    })
    .await;
    assert!(
        rest.is_ok(),
        "kok-dev-env still running {EXITED_WITHIN:?} after it was up:\n{}",
        tail(&output)
    );
    let status = timeout(API_CALL, child.wait())
        .await
        .expect("kok-dev-env exits once its output is closed")
        .expect("wait for kok-dev-env");
    assert!(
        status.success(),
        "kok-dev-env exited with {status}:\n{}",
        tail(&output)
    );

    for operator in OPERATORS {
        let prefix = format!("[{operator}] ");
        assert!(
            output
                .iter()
                .any(|l| l.starts_with(&prefix) && l.contains("connected to")),
            "{operator} never said it connected:\n{}",
            tail(&output)
        );
        let log = dir.path().join(format!("{operator}.log"));
        let logged = std::fs::read_to_string(&log).expect("the operator's log file");
        assert!(
            logged.contains("connected to"),
            "{} lacks the connection line:\n{logged}",
            log.display()
        );
    }
}

/// Sends each line of `stream` to `tx`, prefixed, until the stream closes.
async fn collect(
    stream: impl AsyncRead + Unpin,
    prefix: &'static str,
    tx: mpsc::UnboundedSender<String>,
) {
    let mut reader = BufReader::new(stream).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        if tx.send(format!("{prefix}{line}")).is_err() {
            return;
        }
    }
}

async fn client(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("kok-dev-env wrote the kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a usable kubeconfig");
    Client::try_from(config).expect("client")
}

/// The last lines of the program's output, for failure messages.
fn tail(output: &[String]) -> String {
    let from = output.len().saturating_sub(80);
    output[from..].join("\n")
}
