//! Installing package versions over SSH on real sshd test hosts: fresh
//! install, idempotent re-runs, upgrade and rollback, and the faults that must
//! leave the running version alone.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kok_testenv::hosts::{TestHost, TestHosts};
use kube_on_kube_api::package::{
    Arch, Artifact, ArtifactFormat, Binary, ConfigFile, HealthCheck, InstallSpec,
    PackageVersionSpec, SystemdUnit,
};
use node_operator::Error;
use node_operator::install::{Installer, Limits};
use node_operator::ssh::{Session, Target, Timeouts};

const PKG: &str = "fake-kubelet";
const DIR: &str = "/opt/kube-on-kube/packages/fake-kubelet";

/// Generous for a host that answers: with tests side by side on two
/// cores, sshd's banner has taken more than three seconds.
fn timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(15),
        run: Duration::from_secs(60),
        ..Timeouts::default()
    }
}

/// Short, for a connection that is meant to fail.
fn failing_timeouts() -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(3),
        ..timeouts()
    }
}

fn target(hosts: &TestHosts, host: &TestHost) -> Target {
    Target {
        ip: host.ip(),
        port: host.port(),
        user: "root".into(),
        private_key_pem: hosts.client_private_key_pem(),
        host_public_key: host.host_public_key().to_string(),
    }
}

/// Runs `command` on `host` and returns its trimmed stdout.
fn on(host: &TestHost, command: &str) -> String {
    let output = host.ssh(command);
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Packs a `bin/fake-kubelet` that reports `version` into the artifact
/// directory and returns its file name and sha256.
fn make_artifact(hosts: &TestHosts, version: &str) -> (String, String) {
    let work = tempfile::tempdir().unwrap();
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo fake-kubelet {version}; exit 0; fi\nexec sleep 100000\n"
    );
    let exe = bin.join("fake-kubelet");
    std::fs::write(&exe, script).unwrap();
    run_local(Command::new("chmod").arg("0755").arg(&exe));
    let file = format!("fake-kubelet-{version}.tar.gz");
    let archive = hosts.artifacts_dir().join(&file);
    run_local(
        Command::new("tar")
            .arg("-czf")
            .arg(&archive)
            .arg("-C")
            .arg(work.path())
            .arg("bin"),
    );
    (file, sha256(&archive))
}

fn run_local(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(output.status.success(), "{command:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn sha256(path: &Path) -> String {
    run_local(Command::new("sha256sum").arg(path))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn spec(hosts: &TestHosts, version: &str, file: &str, sha: &str) -> PackageVersionSpec {
    PackageVersionSpec {
        package: PKG.into(),
        version: version.into(),
        artifacts: vec![Artifact {
            arch: Arch::Amd64,
            url: hosts.artifact_url(file),
            sha256: sha.into(),
            format: ArtifactFormat::TarGz,
        }],
        install: InstallSpec {
            before_remove: vec![],
            binaries: vec![Binary {
                path: "bin/fake-kubelet".into(),
                link: Some("/usr/local/bin/fake-kubelet".into()),
            }],
            files: vec![ConfigFile {
                path: "/etc/kubernetes/fake-kubelet.yaml".into(),
                template: "nodeIP: {{nodeIP}}\nversion: {{version}}\n".into(),
                mode: "0600".into(),
            }],
            systemd_unit: Some(SystemdUnit {
                name: "fake-kubelet.service".into(),
                content: "[Unit]\nDescription=fake kubelet\n[Service]\nExecStart=/usr/local/bin/fake-kubelet\nRestart=always\n[Install]\nWantedBy=multi-user.target\n".into(),
            }),
            requires_drain: false,
        },
        health_check: Some(HealthCheck {
            command: Some(vec!["/usr/local/bin/fake-kubelet".into(), "--version".into()]),
            http_get: None,
            timeout_seconds: 10,
        }),
        depends_on: vec![],
    }
}

/// A health check running `script` with `sh -c`, given 2 seconds.
fn shell_check(script: &str) -> Option<HealthCheck> {
    Some(HealthCheck {
        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        http_get: None,
        timeout_seconds: 2,
    })
}

fn values(host: &TestHost) -> BTreeMap<String, serde_json::Value> {
    BTreeMap::from([("nodeIP".to_string(), host.ip().to_string().into())])
}

fn main_pid(host: &TestHost) -> String {
    on(host, "systemctl show -p MainPID fake-kubelet.service")
}

#[tokio::test]
async fn install_rerun_upgrade_and_rollback() {
    let started = Instant::now();
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let (file1, sha1) = make_artifact(&hosts, "1.0.0");
    let (file2, sha2) = make_artifact(&hosts, "2.0.0");
    let v1 = spec(&hosts, "1.0.0", &file1, &sha1);
    let v2 = spec(&hosts, "2.0.0", &file2, &sha2);
    let session = Session::connect(&target(&hosts, host), timeouts())
        .await
        .unwrap();
    let installer = Installer::new(&session);

    let t = Instant::now();
    let result = installer.install(&v1, &values(host)).await.unwrap();
    eprintln!("fresh install in {:?}", t.elapsed());
    assert!(result.changed, "{result:?}");
    assert_eq!(result.version, "1.0.0");
    assert_eq!(result.previous, None);
    assert_eq!(on(host, &format!("readlink {DIR}/current")), "1.0.0");
    assert_eq!(on(host, &format!("cat {DIR}/1.0.0/.complete")), sha1);
    assert_eq!(
        on(host, "readlink /usr/local/bin/fake-kubelet"),
        format!("{DIR}/current/bin/fake-kubelet")
    );
    assert_eq!(
        on(host, "/usr/local/bin/fake-kubelet --version"),
        "fake-kubelet 1.0.0"
    );
    assert_eq!(
        on(host, "cat /etc/kubernetes/fake-kubelet.yaml"),
        format!("nodeIP: {}\nversion: 1.0.0", host.ip())
    );
    assert_eq!(
        on(host, "stat -c %a /etc/kubernetes/fake-kubelet.yaml"),
        "600"
    );
    assert_eq!(
        on(host, "systemctl is-active fake-kubelet.service"),
        "active"
    );
    assert_eq!(
        on(host, &format!("ls -A {DIR}")),
        "1.0.0\ncurrent",
        "no temporary files left"
    );

    let pid = main_pid(host);
    let downloads = hosts.artifact_requests().len();
    let t = Instant::now();
    let again = installer.install(&v1, &values(host)).await.unwrap();
    eprintln!("re-run in {:?}", t.elapsed());
    assert!(!again.changed, "{again:?}");
    assert!(again.steps.iter().all(|s| !s.changed), "{again:?}");
    assert_eq!(main_pid(host), pid, "not restarted");
    assert_eq!(
        hosts.artifact_requests().len(),
        downloads,
        "not downloaded again"
    );

    // What a crash halfway through an earlier fetch of v2 leaves behind.
    on(
        host,
        &format!(
            "mkdir -p {DIR}/2.0.0/bin {DIR}/2.0.0.tmp && touch {DIR}/2.0.0/bin/half {DIR}/2.0.0.tmp/half {DIR}/.2.0.0.download"
        ),
    );
    let up = installer.install(&v2, &values(host)).await.unwrap();
    assert_eq!(
        on(host, &format!("ls -A {DIR} {DIR}/2.0.0/bin")),
        format!("{DIR}:\n1.0.0\n2.0.0\ncurrent\nprevious\n\n{DIR}/2.0.0/bin:\nfake-kubelet"),
        "leftovers of the interrupted fetch are gone"
    );
    assert!(up.changed);
    assert_eq!(up.version, "2.0.0");
    assert_eq!(up.previous.as_deref(), Some("1.0.0"));
    assert_eq!(on(host, &format!("readlink {DIR}/current")), "2.0.0");
    assert_eq!(on(host, &format!("readlink {DIR}/previous")), "1.0.0");
    assert_eq!(
        on(host, "/usr/local/bin/fake-kubelet --version"),
        "fake-kubelet 2.0.0"
    );
    assert_ne!(main_pid(host), pid, "restarted onto the new version");

    let back = installer
        .rollback(PKG, Some("fake-kubelet.service"), v1.health_check.as_ref())
        .await
        .unwrap();
    assert_eq!(back.version, "1.0.0");
    assert_eq!(back.previous.as_deref(), Some("2.0.0"));
    assert_eq!(on(host, &format!("readlink {DIR}/current")), "1.0.0");
    assert_eq!(
        on(host, "/usr/local/bin/fake-kubelet --version"),
        "fake-kubelet 1.0.0"
    );
    assert_eq!(
        on(host, "systemctl is-active fake-kubelet.service"),
        "active"
    );
    session.close().await;
    eprintln!("whole test in {:?}", started.elapsed());
}

#[tokio::test]
async fn bad_artifacts_and_failing_health_checks_leave_current_alone() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let (file1, sha1) = make_artifact(&hosts, "1.0.0");
    let (file2, _) = make_artifact(&hosts, "2.0.0");
    let session = Session::connect(&target(&hosts, host), timeouts())
        .await
        .unwrap();
    let installer = Installer::new(&session);
    installer
        .install(&spec(&hosts, "1.0.0", &file1, &sha1), &values(host))
        .await
        .unwrap();
    let pid = main_pid(host);

    // v2's artifact with v1's checksum.
    let err = installer
        .install(&spec(&hosts, "2.0.0", &file2, &sha1), &values(host))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&sha1), "{err}");
    assert_eq!(on(host, &format!("readlink {DIR}/current")), "1.0.0");
    assert_eq!(
        on(host, &format!("ls -A {DIR}")),
        "1.0.0\ncurrent",
        "nothing of 2.0.0 kept"
    );
    assert_eq!(main_pid(host), pid);

    let err = installer
        .install(
            &spec(&hosts, "3.0.0", "missing.tar.gz", &sha1),
            &values(host),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ArtifactHttp { status: 404, .. }),
        "{err}"
    );
    assert_eq!(err.category(), "artifact_http");
    assert_eq!(on(host, &format!("readlink {DIR}/current")), "1.0.0");

    let (file4, sha4) = make_artifact(&hosts, "4.0.0");
    let mut broken = spec(&hosts, "4.0.0", &file4, &sha4);
    broken.health_check = shell_check("echo not ready; exit 1");
    let err = installer.install(&broken, &values(host)).await.unwrap_err();
    assert!(matches!(err, Error::HealthCheck { .. }), "{err}");
    assert!(err.to_string().contains("not ready"), "{err}");

    // A service that fails its check until it is restarted (containerd
    // whose CRI plugin did not load at start) is restarted once, and then
    // passes: the check below fails while the unit runs the process it saw
    // first.
    let (file5, sha5) = make_artifact(&hosts, "5.0.0");
    let mut needs_restart = spec(&hosts, "5.0.0", &file5, &sha5);
    needs_restart.health_check = shell_check(
        "p=$(systemctl show -p MainPID fake-kubelet.service); f=/run/first-main-pid; \
         [ -s $f ] || echo \"$p\" > $f; \
         [ \"$(cat $f)\" != \"$p\" ] || { echo \"first start, $p\"; exit 1; }",
    );
    let result = installer
        .install(&needs_restart, &values(host))
        .await
        .unwrap();
    let steps: Vec<_> = result.steps.iter().map(|s| s.step).collect();
    assert_eq!(
        steps[steps.len() - 4..],
        ["unit", "health", "unit", "health"],
        "{steps:?}"
    );
    assert!(
        result.steps[steps.len() - 3].tail.contains("first start"),
        "{:?}",
        result.steps
    );
    let first = on(host, "cat /run/first-main-pid");
    assert_ne!(main_pid(host), first, "restarted once");
    session.close().await;
}

#[tokio::test]
async fn host_key_mismatch_is_refused() {
    let hosts = TestHosts::start(2).unwrap();
    let (a, b) = (&hosts.hosts()[0], &hosts.hosts()[1]);
    let mut wrong = target(&hosts, a);
    wrong.host_public_key = b.host_public_key().to_string();
    let t = Instant::now();
    let err = Session::connect(&wrong, timeouts())
        .await
        .err()
        .expect("connect must fail");
    eprintln!("refused in {:?}: {err}", t.elapsed());
    assert!(matches!(err, Error::HostKeyMismatch { .. }), "{err}");
    assert!(err.to_string().contains("does not match"), "{err}");

    let session = Session::connect(&target(&hosts, a), timeouts())
        .await
        .unwrap();
    let output = session.run("hostname").await.unwrap();
    assert_eq!(output.stdout.trim(), a.name());
    session.close().await;
}

#[tokio::test]
async fn unreachable_host_then_converges_after_reconnect() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let (file1, sha1) = make_artifact(&hosts, "1.0.0");
    let v1 = spec(&hosts, "1.0.0", &file1, &sha1);

    host.cut_off().unwrap();
    let t = Instant::now();
    let err = Session::connect(&target(&hosts, host), failing_timeouts())
        .await
        .err()
        .expect("connect must fail");
    eprintln!("unreachable after {:?}: {err}", t.elapsed());
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));

    host.reconnect().unwrap();
    install_after_reconnect(&hosts, host, &v1).await;
}

#[tokio::test]
async fn host_cut_off_mid_install_converges_after_it_returns() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let (file1, sha1) = make_artifact(&hosts, "1.0.0");
    let mut v1 = spec(&hosts, "1.0.0", &file1, &sha1);
    // A slow health check keeps the install busy while the host goes away.
    v1.health_check = Some(HealthCheck {
        command: Some(vec!["sh".into(), "-c".into(), "sleep 3".into()]),
        http_get: None,
        timeout_seconds: 10,
    });
    let session = Session::connect(&target(&hosts, host), timeouts())
        .await
        .unwrap();
    let current = host.path_on_host(format!("{DIR}/current")).unwrap();
    let t = Instant::now();
    let installer = Installer::new(&session);
    let host_values = values(host);
    let install = installer.install(&v1, &host_values);
    let cut = async {
        while std::fs::read_link(&current).is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        host.cut_off().unwrap();
    };
    let (result, ()) = tokio::join!(install, cut);
    let err = result.unwrap_err();
    eprintln!("cut off mid-install, failed after {:?}: {err}", t.elapsed());
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(40));
    assert!(!session.is_alive().await);
    drop(session);

    host.reconnect().unwrap();
    install_after_reconnect(&hosts, host, &v1).await;
}

/// A fresh session installs `spec` completely on a host that was away.
async fn install_after_reconnect(hosts: &TestHosts, host: &TestHost, spec: &PackageVersionSpec) {
    let session = Session::connect(&target(hosts, host), timeouts())
        .await
        .unwrap();
    let result = Installer::new(&session)
        .install(spec, &values(host))
        .await
        .unwrap();
    assert_eq!(result.version, spec.version);
    assert_eq!(on(host, &format!("readlink {DIR}/current")), spec.version);
    assert_eq!(
        on(host, "systemctl is-active fake-kubelet.service"),
        "active"
    );
    assert_eq!(
        on(host, "readlink /usr/local/bin/fake-kubelet"),
        format!("{DIR}/current/bin/fake-kubelet")
    );
    session.close().await;
}

#[tokio::test]
async fn single_binary_artifacts_and_http_health_checks() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let file = "fake-ctl-1.0.0";
    let path = hosts.artifacts_dir().join(file);
    std::fs::write(&path, "#!/bin/sh\necho fake-ctl 1.0.0\n").unwrap();
    let sha = sha256(&path);
    // URLs with credentials (the artifact server ignores them), and a
    // `curl` first on the host's PATH that records every command line on
    // the host each time it runs: the credentials reach curl, never an
    // argv another user of the host could read.
    let password = "s3cret-never-in-argv";
    let with_credentials =
        |url: String| url.replacen("http://", &format!("http://kok:{password}@"), 1);
    let seen = "/var/lib/kube-on-kube/seen-curl";
    on(
        host,
        &format!(
            "mkdir -p /var/lib/kube-on-kube && cat > /usr/local/bin/curl <<'SH'\n#!/bin/sh\n\
             echo run >> {seen}\n\
             cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' >> {seen}\n\
             echo >> {seen}\n\
             exec /usr/bin/curl \"$@\"\nSH\nchmod 0755 /usr/local/bin/curl"
        ),
    );
    let spec = PackageVersionSpec {
        package: "fake-ctl".into(),
        version: "1.0.0".into(),
        artifacts: vec![Artifact {
            arch: Arch::Amd64,
            url: with_credentials(hosts.artifact_url(file)),
            sha256: sha,
            format: ArtifactFormat::Binary,
        }],
        install: InstallSpec {
            before_remove: vec![],
            binaries: vec![Binary {
                path: "bin/fake-ctl".into(),
                link: Some("/usr/local/bin/fake-ctl".into()),
            }],
            ..InstallSpec::default()
        },
        // The artifact server stands in for a service's health endpoint.
        health_check: Some(HealthCheck {
            command: None,
            http_get: Some(with_credentials(hosts.artifact_url(file))),
            timeout_seconds: 5,
        }),
        depends_on: vec![],
    };
    let session = Session::connect(&target(&hosts, host), timeouts())
        .await
        .unwrap();
    let installer = Installer::new(&session);
    let result = installer.install(&spec, &BTreeMap::new()).await.unwrap();
    assert!(result.changed);
    assert_eq!(on(host, "/usr/local/bin/fake-ctl"), "fake-ctl 1.0.0");
    let log = on(host, &format!("cat {seen}"));
    assert_eq!(
        log.lines().filter(|l| *l == "run").count(),
        2,
        "curl ran for the download and the health check: {log}"
    );
    assert!(
        log.contains("curl -K -"),
        "the command lines were read: {log}"
    );
    assert!(
        !log.contains(password),
        "a URL's password was in a command line: {log}"
    );
    assert!(
        !installer
            .install(&spec, &BTreeMap::new())
            .await
            .unwrap()
            .changed
    );

    let mut unhealthy = spec.clone();
    unhealthy.health_check = Some(HealthCheck {
        command: None,
        http_get: Some(hosts.artifact_url("no-such-endpoint")),
        timeout_seconds: 2,
    });
    let err = installer
        .install(&unhealthy, &BTreeMap::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::HealthCheck { .. }), "{err}");
    session.close().await;
}

/// Asserts the host still has 1.0.0 current and nothing else of the package.
fn only_v1_kept(host: &TestHost, what: &str) {
    assert_eq!(
        on(host, &format!("readlink {DIR}/current")),
        "1.0.0",
        "{what}"
    );
    assert_eq!(
        on(host, &format!("ls -A {DIR}")),
        "1.0.0\ncurrent",
        "{what}: nothing else kept"
    );
}

/// Packs an archive in `work` with the local tar and `args` (names as
/// given, `-P` keeping `..` and leading `/`) as `<artifacts>/<file>`; its
/// sha256.
fn pack_raw(hosts: &TestHosts, work: &Path, file: &str, names: &[&str]) -> String {
    let archive = hosts.artifacts_dir().join(file);
    run_local(
        Command::new("tar")
            .arg("-czPf")
            .arg(&archive)
            .arg("-C")
            .arg(work)
            .args(names),
    );
    sha256(&archive)
}

/// Each hostile archive is refused whole: nothing lands outside the version
/// directory, nothing of it is unpacked at all, `current` stays where it was.
#[tokio::test]
async fn archives_reaching_outside_their_directory_are_refused() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let (file1, sha1) = make_artifact(&hosts, "1.0.0");
    let session = Session::connect(&target(&hosts, host), timeouts())
        .await
        .unwrap();
    let installer = Installer::new(&session);
    installer
        .install(&spec(&hosts, "1.0.0", &file1, &sha1), &values(host))
        .await
        .unwrap();

    // What each archive tries to write: files in /opt (a private directory
    // of the host) outside the package's directory.
    let work = tempfile::tempdir().unwrap();
    let deep = work.path().join("a/b/c/d/e");
    std::fs::create_dir_all(deep.join("bin")).unwrap();
    std::fs::write(deep.join("bin/fake-kubelet"), "#!/bin/sh\n").unwrap();
    std::fs::write(work.path().join("a/evil"), "dotdot\n").unwrap();
    let abs = tempfile::tempdir().unwrap();
    std::fs::write(abs.path().join("evil-abs"), "absolute\n").unwrap();
    let link_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(link_dir.path().join("bin")).unwrap();
    std::os::unix::fs::symlink("/opt", link_dir.path().join("bin/out")).unwrap();
    std::os::unix::fs::symlink("../../../../../opt", link_dir.path().join("bin/up")).unwrap();
    // Listed as `bin/x -> y -> /opt`: split at the first arrow, it looked
    // like a link to the relative `y -> /opt`.
    std::os::unix::fs::symlink("/opt", link_dir.path().join("bin/x -> y")).unwrap();
    // From `<version>.tmp`, four levels up is /opt.
    let dotdot = pack_raw(
        &hosts,
        &deep,
        "dotdot.tar.gz",
        &["bin/fake-kubelet", "../../../../evil"],
    );
    let absolute = pack_raw(
        &hosts,
        work.path(),
        "absolute.tar.gz",
        &[abs.path().join("evil-abs").to_str().unwrap()],
    );
    let symlink = pack_raw(&hosts, link_dir.path(), "symlink.tar.gz", &["bin/out"]);
    let relative_link = pack_raw(&hosts, link_dir.path(), "uplink.tar.gz", &["bin/up"]);
    let arrow_link = pack_raw(&hosts, link_dir.path(), "arrow.tar.gz", &["bin/x -> y"]);

    let cases = [
        ("2.0.0", "dotdot.tar.gz", dotdot, "has a .. segment"),
        ("3.0.0", "absolute.tar.gz", absolute, "absolute path"),
        (
            "4.0.0",
            "symlink.tar.gz",
            symlink,
            "points to the absolute path /opt",
        ),
        (
            "5.0.0",
            "uplink.tar.gz",
            relative_link,
            "outside its directory",
        ),
        ("6.0.0", "arrow.tar.gz", arrow_link, "ambiguous link entry"),
    ];
    for (version, file, sha, why) in cases {
        let err = installer
            .install(&spec(&hosts, version, file, &sha), &values(host))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::UnsafeArchive { .. }), "{file}: {err}");
        assert!(err.to_string().contains(why), "{file}: {err}");
        only_v1_kept(host, file);
    }
    assert_eq!(
        on(host, "ls -A /opt"),
        "kube-on-kube",
        "nothing written outside the install root"
    );
    assert_eq!(
        on(host, "ls -A /opt/kube-on-kube/packages"),
        ".fake-kubelet.lock\nfake-kubelet"
    );
    session.close().await;
}

/// A download over the artifact limit and an archive unpacking to more than
/// the unpacked limit (a tar bomb: megabytes of zeros in a few kilobytes)
/// are refused and deleted; the host keeps only what it had.
#[tokio::test]
async fn oversized_artifacts_and_tar_bombs_are_refused() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let (file1, sha1) = make_artifact(&hosts, "1.0.0");
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("bin")).unwrap();
    std::fs::write(work.path().join("bin/fake-kubelet"), vec![0u8; 64 << 20]).unwrap();
    let bomb = pack_raw(&hosts, work.path(), "bomb.tar.gz", &["bin"]);
    let bomb_size = std::fs::metadata(hosts.artifacts_dir().join("bomb.tar.gz"))
        .unwrap()
        .len();
    assert!(bomb_size < 1 << 20, "the bomb is small: {bomb_size} bytes");
    let session = Session::connect(&target(&hosts, host), timeouts())
        .await
        .unwrap();
    let installer = Installer::new(&session).with_limits(Limits {
        artifact_bytes: 1 << 20,
        unpacked_bytes: 16 << 20,
    });
    installer
        .install(&spec(&hosts, "1.0.0", &file1, &sha1), &values(host))
        .await
        .unwrap();

    let err = installer
        .install(&spec(&hosts, "2.0.0", "bomb.tar.gz", &bomb), &values(host))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::TooLarge { limit, .. } if limit == 16 << 20),
        "{err}"
    );
    assert_eq!(err.category(), "too_large");
    only_v1_kept(host, "tar bomb");
    assert_eq!(on(host, &format!("du -sm {DIR} | cut -f1")), "1");

    let small = Installer::new(&session).with_limits(Limits {
        artifact_bytes: 1000,
        unpacked_bytes: 16 << 20,
    });
    let err = small
        .install(&spec(&hosts, "2.0.0", "bomb.tar.gz", &bomb), &values(host))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { limit: 1000, .. }), "{err}");
    assert!(err.to_string().contains("the download"), "{err}");
    only_v1_kept(host, "oversized download");
    session.close().await;
}

/// A secret written to a host (the bootstrap kubeconfig's token) is in no
/// process's command line while it is written, and the file holding it is
/// private from its creation, not only after its `chmod`: a `base64` placed
/// first on the host's PATH records, at the moment it decodes the content,
/// every command line on the host and the mode of the file it writes to.
#[tokio::test]
async fn secrets_are_written_privately_and_never_in_a_command_line() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let seen = "/var/lib/kube-on-kube/seen";
    on(
        host,
        &format!(
            "cat > /usr/local/bin/base64 <<'SH'\n#!/bin/sh\n\
             echo \"mode=$(stat -c %a \"$(readlink /proc/$$/fd/1)\")\" >> {seen}\n\
             cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' >> {seen}\n\
             exec /usr/bin/base64 \"$@\"\nSH\nchmod 0755 /usr/local/bin/base64"
        ),
    );
    let session = Session::connect(&target(&hosts, host), timeouts())
        .await
        .unwrap();
    let secret = "abcdef.0123456789abcdef-never-in-argv";
    let changed = node_operator::host::Host::new(&session)
        .files(&[(
            "/etc/kubernetes/bootstrap-kubelet.conf",
            "0600",
            &format!("token: {secret}\n"),
        )])
        .await
        .unwrap();
    assert!(changed);
    let log = on(host, &format!("cat {seen}"));
    let modes: Vec<&str> = log.lines().filter(|l| l.starts_with("mode=")).collect();
    assert_eq!(modes, ["mode=600"], "private while being written");
    assert!(log.contains("sh -s"), "the command lines were read: {log}");
    assert!(!log.contains(secret), "the secret was in a command line");
    let encoded = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("token: {secret}\n"))
    };
    assert!(
        !log.contains(&encoded),
        "the encoded secret was in a command line"
    );
    assert_eq!(
        on(host, "stat -c %a /etc/kubernetes/bootstrap-kubelet.conf"),
        "600"
    );
    session.close().await;
}

/// The node-operator's peak memory so far (VmHWM), in bytes.
fn peak_memory() -> u64 {
    kok_testenv::process_memory(std::process::id(), "VmHWM").expect("VmHWM")
}

/// A host whose shell prints 2 GiB before it runs anything: the script is
/// stopped once its output passes the bound, the step fails with
/// OutputTooLarge, the node-operator's memory does not follow the host's
/// output, and the same session runs the next script once the host
/// behaves.
#[tokio::test]
async fn a_host_that_prints_without_end_is_cut_off() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    // First on sshd's PATH, so `sh -s` is this one.
    on(
        host,
        "cat > /usr/local/bin/sh <<'SH'\n#!/bin/bash\n\
         head -c 2147483648 /dev/zero | tr '\\0' x\n\
         exec /bin/sh \"$@\"\nSH\nchmod 0755 /usr/local/bin/sh",
    );
    let session = Session::connect(&target(&hosts, host), timeouts())
        .await
        .unwrap();
    let before = peak_memory();
    let started = Instant::now();
    let err = session.run("echo hello").await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&err, Error::OutputTooLarge { stream: "stdout", limit, .. }
            if *limit == node_operator::ssh::MAX_OUTPUT_BYTES),
        "{err}"
    );
    assert_eq!(err.category(), "output_too_large");
    assert!(err.to_string().contains("output too large"), "{err}");
    assert!(err.to_string().contains("xxxx"), "the tail is shown: {err}");
    let grew = peak_memory().saturating_sub(before);
    println!("cut off after {took:?}; peak memory grew by {grew} bytes");
    assert!(
        grew < 64 << 20,
        "reading a host's output grew the process by {grew} bytes"
    );
    // What printed is stopped, not left writing into a closed channel.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = on(host, "pgrep -x head || true");
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the printing process still runs: {left}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    on(host, "rm /usr/local/bin/sh");
    let output = session.run("echo hello").await.unwrap();
    assert_eq!(output.stdout, "hello\n");
    session.close().await;
}
