//! The SSH test hosts against the real sshd, ssh and kernel namespaces: what
//! node-operator's tests rely on, each checked from the outside as they will.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kok_testenv::hosts::{TestHost, TestHosts, clean_stale_runs};

// Tests may keep one run in a static and share it.
const _: () = {
    fn shareable<T: Send + Sync>() {}
    let _ = shareable::<TestHosts>;
};

/// Runs `command` on `host` and returns its stdout; fails the test if it fails.
fn run(host: &TestHost, command: &str) -> String {
    let out = host.ssh(command);
    assert!(
        out.status.success(),
        "`{command}` on {} failed ({}): {}{}",
        host.name(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The exit code of `command` on `host`.
fn code(host: &TestHost, command: &str) -> i32 {
    host.ssh(command).status.code().unwrap_or(-1)
}

/// Polls `check` for up to `limit`.
fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn install_unit(host: &TestHost, name: &str, text: &str) {
    run(
        host,
        &format!("cat > /etc/systemd/system/{name} <<'EOF'\n{text}EOF\nsystemctl daemon-reload"),
    );
}

fn main_pid(host: &TestHost, unit: &str) -> u32 {
    run(host, &format!("systemctl show -p MainPID --value {unit}"))
        .parse()
        .unwrap_or(0)
}

#[test]
fn each_host_has_its_own_name_address_and_files() {
    let started = Instant::now();
    let hosts = TestHosts::start(3).unwrap();
    eprintln!("3 hosts up in {:?}", started.elapsed());
    let all = hosts.hosts();
    for host in all {
        assert_eq!(run(host, "hostname"), host.name());
        let addrs = run(host, "ip -o -4 addr show");
        assert!(addrs.contains(&format!("inet {}/24", host.ip())), "{addrs}");
        for other in all.iter().filter(|o| o.ip() != host.ip()) {
            assert!(!addrs.contains(&format!("inet {}/", other.ip())), "{addrs}");
        }
        // Its own PID namespace: its init is PID 1.
        assert!(run(host, "cat /proc/1/cmdline").contains("kok-testhost"));
        // What the run made is known to be this process's.
        assert_eq!(
            kok_testenv::owner_pid(&host.cgroup_root()),
            Some(std::process::id())
        );
    }

    let (a, b) = (&all[0], &all[1]);
    let marker = format!("marker-{}", hosts.run_id());
    run(
        a,
        &format!(
            "echo on-a > /opt/{marker} && echo on-a > /usr/local/bin/{marker} && \
             echo on-a > /etc/kubernetes/{marker}"
        ),
    );
    assert_eq!(run(a, &format!("cat /opt/{marker}")), "on-a");
    for dir in ["/opt", "/usr/local/bin", "/etc/kubernetes"] {
        assert_eq!(code(b, &format!("test -e {dir}/{marker}")), 1, "{dir} on b");
        assert!(
            !Path::new(dir).join(&marker).exists(),
            "{dir} on the machine"
        );
    }
    let on_machine = a.path_on_host(format!("/opt/{marker}")).unwrap();
    assert_eq!(std::fs::read_to_string(on_machine).unwrap(), "on-a\n");
    assert_eq!(a.path_on_host("/usr/bin/env"), None);

    // Hosts reach each other and the machine.
    run(
        a,
        &format!("timeout 5 bash -c 'echo > /dev/tcp/{}/22'", b.ip()),
    );
    assert!(
        hosts
            .client_private_key_pem()
            .contains("OPENSSH PRIVATE KEY")
    );
    assert!(a.host_public_key().starts_with("ssh-ed25519 "));
    assert_ne!(a.host_public_key(), b.host_public_key());
}

/// A unit whose process is easy to spot: `sleep 1000`.
const SLEEP_UNIT: &str = "[Service]\nExecStart=/bin/sleep 1000\n";

const DEMO_UNIT: &str = r#"[Unit]
Description=Demo service
[Service]
Environment=GREETING=hello "SPACED=a b"
EnvironmentFile=/etc/kubernetes/demo.env
ExecStart=/bin/sh -c 'echo "started $GREETING $SPACED $FROM_FILE"; exec sleep 1000'
[Install]
WantedBy=multi-user.target
"#;

#[test]
fn systemctl_starts_stops_and_restarts_units() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    run(host, "echo FROM_FILE=from-file > /etc/kubernetes/demo.env");
    install_unit(host, "demo.service", DEMO_UNIT);
    assert_eq!(code(host, "systemctl is-active demo"), 3);
    assert_eq!(code(host, "systemctl status nonexistent"), 4);
    assert_eq!(code(host, "systemctl start nonexistent"), 5);

    run(host, "systemctl start demo.service");
    assert_eq!(run(host, "systemctl is-active demo"), "active");
    let first = main_pid(host, "demo");
    assert_ne!(first, 0);
    assert_eq!(run(host, &format!("ps -o comm= -p {first}")), "sleep");
    eventually(Duration::from_secs(5), "the unit's output", || {
        host.ssh("journalctl -u demo --no-pager").stdout == b"started hello a b from-file\n"
    });
    let status = run(host, "systemctl status demo");
    assert!(status.contains("Active: active (running)"), "{status}");

    run(host, "systemctl restart demo");
    let second = main_pid(host, "demo");
    assert!(second != 0 && second != first, "{first} then {second}");
    assert_eq!(code(host, &format!("kill -0 {first}")), 1);

    run(host, "systemctl stop demo");
    assert_eq!(code(host, "systemctl is-active demo"), 3);
    assert_eq!(run(host, "systemctl is-active demo || true"), "inactive");
    assert_eq!(code(host, &format!("kill -0 {second}")), 1);
    assert_eq!(code(host, "pgrep -x sleep"), 1);
    assert_eq!(main_pid(host, "demo"), 0);

    // The full path works too, for callers that use it.
    run(
        host,
        "/usr/bin/systemctl start demo && /bin/systemctl is-active demo",
    );
}

#[test]
fn units_restart_by_policy_and_fail_when_they_must() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    install_unit(
        host,
        "always.service",
        "[Service]\nExecStart=/bin/sleep 1000\nRestart=always\nRestartSec=100ms\n",
    );
    install_unit(
        host,
        "broken.service",
        "[Service]\nExecStart=/bin/sh -c 'exit 3'\n",
    );
    install_unit(
        host,
        "flapping.service",
        "[Service]\nExecStart=/bin/false\nRestart=on-failure\nRestartSec=50ms\n",
    );

    run(host, "systemctl start always");
    let first = main_pid(host, "always");
    run(host, &format!("kill -9 {first}"));
    eventually(Duration::from_secs(5), "an automatic restart", || {
        let pid = main_pid(host, "always");
        pid != 0 && pid != first
    });
    assert_eq!(run(host, "systemctl show -p NRestarts --value always"), "1");
    assert_eq!(run(host, "systemctl is-active always"), "active");

    run(host, "systemctl start broken");
    eventually(Duration::from_secs(5), "the unit to fail", || {
        code(host, "systemctl is-failed broken") == 0
    });
    assert_eq!(code(host, "systemctl is-active broken"), 3);
    assert_eq!(
        run(host, "systemctl show -p Result,ExecMainStatus broken"),
        "Result=exit-code\nExecMainStatus=3"
    );

    run(host, "systemctl start flapping");
    eventually(Duration::from_secs(10), "the start limit", || {
        host.ssh("systemctl show -p Result --value flapping").stdout == b"start-limit-hit\n"
    });
    run(host, "systemctl reset-failed flapping");
    assert_eq!(
        run(host, "systemctl is-active flapping || true"),
        "inactive"
    );
}

#[test]
fn oneshot_units_pre_commands_and_unrunnable_programs() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    install_unit(
        host,
        "setup.service",
        "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStartPre=-/bin/false\n\
         ExecStartPre=/bin/sh -c 'echo pre > /opt/steps'\n\
         ExecStart=/bin/sh -c 'echo main >> /opt/steps'\n",
    );
    install_unit(
        host,
        "missing.service",
        "[Service]\nExecStart=/opt/not-installed\n",
    );

    run(host, "systemctl start setup");
    assert_eq!(run(host, "cat /opt/steps"), "pre\nmain");
    assert_eq!(
        run(host, "systemctl show -p SubState --value setup"),
        "exited"
    );
    assert_eq!(run(host, "systemctl is-active setup"), "active");
    assert_eq!(run(host, "systemctl is-enabled setup"), "static");

    // As with systemd's Type=simple: the start succeeds, the unit fails.
    run(host, "systemctl start missing");
    eventually(Duration::from_secs(5), "the unit to fail", || {
        code(host, "systemctl is-failed missing") == 0
    });
    assert_eq!(
        run(host, "systemctl show -p ExecMainStatus --value missing"),
        "203"
    );
    assert!(run(host, "journalctl -u missing").contains("/opt/not-installed"));
}

/// A unit whose main process leaves a child behind in a session of its
/// own, which only the unit's cgroup still ties to it.
fn forking_unit(kill_mode: &str) -> String {
    format!(
        "[Service]\nExecStart=/bin/sh -c 'setsid sleep 2000 & exec sleep 1000'\n\
         KillMode={kill_mode}\n"
    )
}

fn pids_of(host: &TestHost, command: &str) -> Vec<String> {
    run(host, &format!("pgrep -f '^{command}$' || true"))
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn units_run_in_cgroups_with_kill_modes_limits_and_dependencies() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let root = host.cgroup_root();

    // KillMode=control-group (the default) stops what the unit started;
    // KillMode=process leaves it running, as containerd's shims must be.
    install_unit(host, "grouped.service", &forking_unit("control-group"));
    install_unit(host, "keeper.service", &forking_unit("process"));
    run(host, "systemctl start grouped");
    eventually(Duration::from_secs(5), "the grouped child", || {
        pids_of(host, "sleep 2000").len() == 1
    });
    let grouped_child = pids_of(host, "sleep 2000");
    let cgroup = run(host, &format!("cat /proc/{}/cgroup", grouped_child[0]));
    for line in cgroup.lines() {
        assert!(
            line.ends_with(&format!("{root}/system.slice/grouped.service")),
            "{cgroup}"
        );
    }
    assert_eq!(
        run(host, "systemctl show -p ControlGroup,KillMode grouped"),
        format!("ControlGroup={root}/system.slice/grouped.service\nKillMode=control-group")
    );
    run(host, "systemctl stop grouped");
    assert_eq!(pids_of(host, "sleep 2000"), Vec::<String>::new());

    run(host, "systemctl start keeper");
    eventually(Duration::from_secs(5), "the keeper's child", || {
        pids_of(host, "sleep 2000").len() == 1
    });
    let kept = pids_of(host, "sleep 2000");
    let main = main_pid(host, "keeper");
    run(host, "systemctl restart keeper");
    assert_ne!(main_pid(host, "keeper"), main);
    assert_eq!(code(host, &format!("kill -0 {main}")), 1);
    let after_restart = pids_of(host, "sleep 2000");
    assert!(after_restart.contains(&kept[0]), "{after_restart:?}");
    run(host, "systemctl stop keeper");
    assert!(pids_of(host, "sleep 2000").contains(&kept[0]));

    // Resource limits: exactly as asked, or as close as the host allows.
    install_unit(
        host,
        "limited.service",
        "[Service]\nExecStart=/bin/sleep 1000\nLimitNOFILE=1234\nLimitNPROC=500:600\n",
    );
    install_unit(
        host,
        "unlimited.service",
        "[Service]\nExecStart=/bin/sleep 1001\nLimitNOFILE=infinity\n",
    );
    run(host, "systemctl start limited unlimited");
    let limits = |unit: &str, what: &str| {
        let limits = run(host, &format!("cat /proc/{}/limits", main_pid(host, unit)));
        let line = limits
            .lines()
            .find(|l| l.starts_with(what))
            .unwrap()
            .to_owned();
        line.split_whitespace()
            .rev()
            .skip(1)
            .take(2)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(limits("limited", "Max open files"), "1234 1234");
    assert_eq!(limits("limited", "Max processes"), "500 600");
    let own = std::fs::read_to_string("/proc/self/limits").unwrap();
    let hard = own
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .unwrap()
        .to_owned();
    assert_eq!(
        limits("unlimited", "Max open files"),
        format!("{hard} {hard}")
    );

    // Dependencies: starting a unit starts what it requires first; a stop or
    // restart of the required unit reaches it; a missing one refuses.
    install_unit(
        host,
        "base.service",
        "[Service]\nExecStart=/bin/sleep 1002\n",
    );
    install_unit(
        host,
        "top.service",
        "[Unit]\nRequires=base.service\nAfter=base.service network.target\n\
         [Service]\nExecStart=/bin/sleep 1003\n",
    );
    install_unit(
        host,
        "orphan.service",
        "[Unit]\nRequires=nowhere.service\n[Service]\nExecStart=/bin/sleep 1004\n",
    );
    run(host, "systemctl start top");
    assert_eq!(run(host, "systemctl is-active base top"), "active\nactive");
    let (base, top) = (main_pid(host, "base"), main_pid(host, "top"));
    run(host, "systemctl restart base");
    assert_ne!(main_pid(host, "base"), base);
    assert_ne!(main_pid(host, "top"), top);
    assert_eq!(run(host, "systemctl is-active top"), "active");
    run(host, "systemctl stop base");
    assert_eq!(
        run(host, "systemctl is-active base top || true"),
        "inactive\ninactive"
    );
    let refused = host.ssh("systemctl start orphan");
    assert_eq!(refused.status.code(), Some(5));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("nowhere.service not found"));
}

#[test]
fn hosts_have_their_own_cgroups_etc_and_a_route_through_the_machine() {
    let hosts = TestHosts::start(2).unwrap();
    let other_run = TestHosts::start(1).unwrap();
    let (a, b) = (&hosts.hosts()[0], &hosts.hosts()[1]);
    let c = &other_run.hosts()[0];

    // The same cgroup path in every hierarchy, holding init and sshd.
    let root = a.cgroup_root();
    assert_eq!(root, format!("/kok-hosts/{}", a.name()));
    let hierarchies: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect();
    assert!(!hierarchies.is_empty());
    for hierarchy in &hierarchies {
        let dir = hierarchy.join(root.trim_start_matches('/'));
        assert!(dir.join("init.scope").is_dir(), "{}", dir.display());
    }
    let init = std::fs::read_to_string(format!("/proc/{}/cgroup", a.init_pid().unwrap())).unwrap();
    assert!(
        init.lines()
            .all(|l| l.ends_with(&format!("{root}/init.scope"))),
        "{init}"
    );
    // The host sees them too, and its CPUs.
    assert!(run(a, "cat /proc/self/cgroup").contains(&format!("{root}/system.slice/ssh.service")));
    assert_eq!(
        run(a, "nproc"),
        std::thread::available_parallelism().unwrap().to_string()
    );

    // A stopped host's cgroups are gone; a booted one has them again.
    a.stop();
    for hierarchy in &hierarchies {
        assert!(!hierarchy.join(root.trim_start_matches('/')).exists());
    }
    a.start().unwrap();
    assert!(run(a, "cat /proc/1/cgroup").contains(&format!("{root}/init.scope")));

    // /etc is the machine's, with each host's own changes.
    let marker = format!("kok-marker-{}", hosts.run_id());
    run(a, &format!("echo on-a > /etc/{marker}"));
    assert_eq!(run(a, &format!("cat /etc/{marker}")), "on-a");
    assert_eq!(code(b, &format!("test -e /etc/{marker}")), 1);
    assert!(!Path::new("/etc").join(&marker).exists());
    assert_eq!(
        run(a, "cat /etc/os-release"),
        std::fs::read_to_string("/etc/os-release").unwrap().trim()
    );
    assert_eq!(run(a, "cat /etc/hostname"), a.name());
    assert_ne!(run(a, "cat /etc/machine-id"), run(b, "cat /etc/machine-id"));
    // Mounts are shared inside the host, as under systemd.
    assert_eq!(run(a, "findmnt -n -o PROPAGATION /"), "shared");

    // The default route leads to the machine, which forwards to its other
    // bridges (here another run's) but nowhere off the machine.
    assert_eq!(
        run(a, "ip route show default"),
        format!("default via {} dev eth0", hosts.gateway_ip())
    );
    run(
        a,
        &format!("timeout 5 bash -c 'echo > /dev/tcp/{}/22'", c.ip()),
    );
    run(
        c,
        &format!("timeout 5 bash -c 'echo > /dev/tcp/{}/22'", b.ip()),
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .unwrap()
            .trim(),
        "1"
    );
    // Asked of the machine's routing, not sent: addresses off the machine
    // (the machine's own gateway, anything its default route leads to) are
    // unreachable for packets from the hosts.
    let default = Command::new("ip")
        .args(["-4", "route", "show", "default"])
        .output()
        .unwrap();
    let default = String::from_utf8_lossy(&default.stdout).into_owned();
    let gateway = default
        .split_whitespace()
        .skip_while(|w| *w != "via")
        .nth(1);
    for off_machine in gateway.into_iter().chain(["198.51.100.7"]) {
        let route = Command::new("ip")
            .args(["route", "get", off_machine, "from", &a.ip().to_string()])
            .args(["iif", &hosts.bridge()])
            .output()
            .unwrap();
        assert!(!route.status.success(), "{off_machine}: {route:?}");
        assert!(
            String::from_utf8_lossy(&route.stderr).contains("unreachable"),
            "{off_machine}: {route:?}"
        );
    }
    let to_other_run = Command::new("ip")
        .args([
            "route",
            "get",
            &c.ip().to_string(),
            "from",
            &a.ip().to_string(),
        ])
        .args(["iif", &hosts.bridge()])
        .output()
        .unwrap();
    assert!(to_other_run.status.success(), "{to_other_run:?}");
}

#[test]
fn artifact_server_serves_files_to_hosts() {
    let hosts = TestHosts::start(1).unwrap();
    let host = &hosts.hosts()[0];
    let dir = hosts.artifacts_dir().join("pkg");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hello.txt"), "hello artifact\n").unwrap();

    let url = hosts.artifact_url("pkg/hello.txt");
    assert_eq!(run(host, &format!("curl -fsS {url}")), "hello artifact");
    run(
        host,
        &format!(
            "curl -fsS -o /opt/hello.txt {url} && cmp /opt/hello.txt /dev/stdin <<< 'hello artifact'"
        ),
    );
    let missing = hosts.artifact_url("pkg/missing.txt");
    assert_eq!(code(host, &format!("curl -fsS {missing}")), 22);
    assert_eq!(
        hosts.artifact_requests(),
        ["/pkg/hello.txt", "/pkg/hello.txt", "/pkg/missing.txt"]
    );
}

#[test]
fn cut_off_hosts_are_unreachable_until_reconnected_with_state_intact() {
    let hosts = TestHosts::start(2).unwrap();
    let (a, b) = (&hosts.hosts()[0], &hosts.hosts()[1]);
    run(a, "echo kept > /var/lib/kubelet/state");
    install_unit(a, "demo.service", SLEEP_UNIT);
    run(a, "systemctl start demo");
    let pid = main_pid(a, "demo");

    a.cut_off().unwrap();
    let started = Instant::now();
    let out = a.ssh_with_timeout("true", Duration::from_secs(1));
    assert_eq!(out.status.code(), Some(255), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    run(b, "true");

    a.reconnect().unwrap();
    assert_eq!(run(a, "cat /var/lib/kubelet/state"), "kept");
    assert_eq!(main_pid(a, "demo"), pid);
    assert_eq!(run(a, "systemctl is-active demo"), "active");
}

#[test]
fn stopping_and_starting_a_host_is_a_reboot() {
    let hosts = TestHosts::start(2).unwrap();
    let (a, b) = (&hosts.hosts()[0], &hosts.hosts()[1]);
    run(a, "echo kept > /opt/state && echo gone > /tmp/state");
    install_unit(
        a,
        "enabled.service",
        DEMO_UNIT
            .replace("EnvironmentFile=", "EnvironmentFile=-")
            .as_str(),
    );
    install_unit(a, "manual.service", SLEEP_UNIT);
    let enabled = a.ssh("systemctl enable enabled");
    assert!(String::from_utf8_lossy(&enabled.stderr).contains("Created symlink"));
    assert_eq!(run(a, "systemctl is-enabled enabled"), "enabled");
    run(a, "systemctl start manual");
    let before = a.init_pid().unwrap();

    a.stop();
    assert!(!a.is_running());
    assert_eq!(
        a.ssh_with_timeout("true", Duration::from_secs(1))
            .status
            .code(),
        Some(255)
    );
    eventually(Duration::from_secs(5), "the old init to go", || {
        !Path::new(&format!("/proc/{before}")).exists()
    });
    run(b, "true");

    a.start().unwrap();
    assert_ne!(a.init_pid(), Some(before));
    // Same address and host key: the pinned known_hosts entry still matches.
    assert_eq!(run(a, "hostname"), a.name());
    assert_eq!(run(a, "cat /opt/state"), "kept");
    assert_eq!(code(a, "test -e /tmp/state"), 1);
    assert_eq!(run(a, "systemctl is-active enabled"), "active");
    assert_eq!(code(a, "systemctl is-active manual"), 3);

    run(a, "systemctl disable --now enabled");
    assert_eq!(code(a, "systemctl is-enabled enabled"), 1);
    assert_eq!(code(a, "systemctl is-active enabled"), 3);
}

/// The namespaces of a host's init, to find any process left in them.
fn namespaces_of(pid: u32) -> Vec<String> {
    ["pid", "net", "mnt"]
        .iter()
        .filter_map(|ns| std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok())
        .map(|link| link.display().to_string())
        .collect()
}

/// Now, in the clock ticks since boot that `/proc/<pid>/stat` counts in.
fn ticks_now() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let seconds: f64 = uptime.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (seconds * per_second) as u64
}

/// Processes (not zombies, which hold no namespace) in any of `namespaces`
/// that started before `cutoff` (ticks since boot). A namespace's number is
/// given again once it is gone, so a process started after the hosts were
/// taken down, in a namespace of something else running on the machine, may
/// show up under one of their old numbers: it is not theirs.
fn processes_in(namespaces: &[String], cutoff: u64) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let rest = stat.rsplit(')').next().unwrap_or_default();
        if rest.trim_start().starts_with('Z') {
            continue;
        }
        // Field 22 of stat, the 20th after the command's closing parenthesis.
        let started: u64 = rest
            .split_whitespace()
            .nth(19)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        if started > cutoff {
            continue;
        }
        for ns in ["pid", "net", "mnt"] {
            let link = std::fs::read_link(entry.path().join("ns").join(ns));
            if link.is_ok_and(|l| namespaces.contains(&l.display().to_string())) {
                let cmd = std::fs::read_to_string(entry.path().join("cmdline")).unwrap_or_default();
                found.push(format!("{pid} {}", cmd.replace('\0', " ")));
                break;
            }
        }
    }
    found
}

fn interfaces_of(run_id: &str) -> Vec<String> {
    let out = Command::new("ip").args(["-o", "link"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("kt{run_id}")))
        .map(str::to_owned)
        .collect()
}

/// The hierarchies holding a cgroup of a host of `run_id`.
fn cgroups_of(run_id: &str) -> Vec<String> {
    let mut found = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let parent = hierarchy.path().join("kok-hosts");
        for host in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            if host
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("kt{run_id}-"))
            {
                found.push(host.path().display().to_string());
            }
        }
    }
    found
}

/// Policy-routing rules naming the bridge of `run_id`.
fn rules_of(run_id: &str) -> Vec<String> {
    let out = Command::new("ip").args(["rule", "show"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("kt{run_id}br")))
        .map(str::to_owned)
        .collect()
}

fn assert_nothing_left(run_id: &str, namespaces: &[String], cutoff: u64, after_kill: bool) {
    eventually(
        Duration::from_secs(10),
        "the hosts' processes to die",
        || processes_in(namespaces, cutoff).is_empty(),
    );
    if after_kill {
        // Nothing of the dead process could remove these; the next run does
        // (which may be one started meanwhile by another test).
        clean_stale_runs().unwrap();
    }
    assert_eq!(interfaces_of(run_id), Vec::<String>::new());
    assert_eq!(cgroups_of(run_id), Vec::<String>::new());
    assert_eq!(rules_of(run_id), Vec::<String>::new());
    assert!(!Path::new("/run/kok-testenv").join(run_id).exists());
}

#[test]
fn dropping_the_hosts_leaves_nothing_behind() {
    let hosts = TestHosts::start(2).unwrap();
    let host = &hosts.hosts()[0];
    install_unit(host, "demo.service", SLEEP_UNIT);
    run(host, "systemctl start demo");
    let run_id = hosts.run_id().to_owned();
    let namespaces: Vec<String> = hosts
        .hosts()
        .iter()
        .flat_map(|h| namespaces_of(h.init_pid().unwrap()))
        .collect();
    assert_eq!(namespaces.len(), 6);
    // Per host its launcher, init and sshd, and the unit's process (which
    // `systemctl start` may return before, and which may share the clock
    // tick it is counted in).
    eventually(Duration::from_secs(5), "the unit's process", || {
        processes_in(&namespaces, ticks_now()).len() == 2 * 3 + 1
    });
    assert_eq!(interfaces_of(&run_id).len(), 3);
    assert!(rules_of(&run_id).len() >= 2);
    assert!(!cgroups_of(&run_id).is_empty());

    let cutoff = ticks_now();
    drop(hosts);
    assert_eq!(processes_in(&namespaces, cutoff), Vec::<String>::new());
    assert_nothing_left(&run_id, &namespaces, cutoff, false);
}

const CHILD_ENV: &str = "KOK_HOSTS_TEST_CHILD";

/// Not a test of its own: the body of the child process that
/// `a_dying_test_process_leaves_nothing_behind` starts and then lets panic,
/// exit, or kills.
#[test]
fn child_process_holding_hosts() {
    let Ok(how) = std::env::var(CHILD_ENV) else {
        return;
    };
    let hosts = TestHosts::start(2).unwrap();
    let host = &hosts.hosts()[0];
    install_unit(host, "demo.service", SLEEP_UNIT);
    run(host, "systemctl start demo");
    let pids: Vec<String> = hosts
        .hosts()
        .iter()
        .map(|h| h.init_pid().unwrap_or(0).to_string())
        .collect();
    println!("RUN {} {}", hosts.run_id(), pids.join(" "));
    // Waits until the parent has seen the hosts.
    let _ = std::io::stdin().read_line(&mut String::new());
    match how.as_str() {
        "panic" => panic!("the test fails while holding hosts"),
        // Leaked, as hosts kept in a static are: only the exit hook is left.
        "exit" => std::mem::forget(hosts),
        _ => std::thread::sleep(Duration::from_secs(120)),
    }
}

#[test]
fn a_dying_test_process_leaves_nothing_behind() {
    let exe = std::env::current_exe().unwrap();
    for how in ["panic", "exit", "kill"] {
        let mut child = Command::new(&exe)
            .args([
                "child_process_holding_hosts",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, how)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        // libtest may have started the line with the test's name.
        let line = (&mut stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.find("RUN ").map(|at| l[at..].to_owned()))
            .unwrap_or_else(|| panic!("the {how} child printed no RUN line"));
        let words: Vec<&str> = line.split_whitespace().collect();
        let run_id = words[1].to_owned();
        let namespaces: Vec<String> = words[2..]
            .iter()
            .flat_map(|pid| namespaces_of(pid.parse().unwrap()))
            .collect();
        assert_eq!(namespaces.len(), 6, "{line}");
        assert!(!cgroups_of(&run_id).is_empty());
        let cutoff = ticks_now();
        if how == "kill" {
            child.kill().unwrap();
        } else {
            child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        }
        // Read to the end: a child that cannot print its results fails.
        std::io::copy(&mut stdout, &mut std::io::sink()).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.success(), how == "exit", "{how}: {status}");
        assert_nothing_left(&run_id, &namespaces, cutoff, how == "kill");
    }
}

#[test]
fn many_hosts_start_quickly() {
    let started = Instant::now();
    let hosts = TestHosts::start(30).unwrap();
    let up = started.elapsed();
    for host in hosts.hosts() {
        assert_eq!(run(host, "hostname"), host.name());
    }
    eprintln!(
        "30 hosts up in {up:?}, all answered after {:?}",
        started.elapsed()
    );
    assert!(up < Duration::from_secs(30), "{up:?}");
}
