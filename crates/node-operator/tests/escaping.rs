//! Nothing from a Machine's spec reaches its host unescaped, end to end: a
//! real API server refuses Machines whose labels, taints or sysctls try to
//! add a line to the kubelet's unit file, and a valid value full of spaces,
//! quotes, `$` and `%` reaches the host's unit file as one quoted argument
//! and the kubelet's command line as exactly that one argument.

mod support;

use std::time::Duration;

use kube::api::PostParams;
use kube_on_kube_api::Machine;
use serde_json::json;

use support::*;

/// Written raw into the unit, this would run a command as root before the
/// kubelet starts.
const INJECTION: &str = "a\nExecStartPre=/bin/sh -c 'id > /tmp/pwned'";

/// A valid kubelet flag value that a naive unit line would split, expand or
/// treat as a specifier.
const TRICKY: &str = r#"a b "c" 'd' $HOME ${HOME} 50% %n \x"#;

/// The Machine of `host` with `change` applied to its JSON.
fn machine_with(
    host: &kok_testenv::hosts::TestHost,
    change: impl Fn(&mut serde_json::Value),
) -> Machine {
    let mut value = serde_json::to_value(machine(host, host.host_public_key(), 0)).unwrap();
    change(&mut value);
    serde_json::from_value(value).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_values_reach_the_host_quoted_or_not_at_all() {
    let h = Harness::start(HarnessOptions { hosts: 1 }).await;
    let host = &h.hosts.hosts()[0];
    let api = h.machines();

    // Each injection is refused by the API server, before any operator runs.
    let attempts = [
        (
            "spec.kubelet.nodeLabels.pool",
            "spec/kubelet/nodeLabels",
            json!({"pool": INJECTION}),
        ),
        ("spec.zone", "spec/zone", json!(INJECTION)),
        (
            "spec.kubelet.taints[0].value",
            "spec/kubelet/taints",
            json!([{"key": "dedicated", "value": INJECTION, "effect": "NoSchedule"}]),
        ),
        (
            "spec.kubelet.extraArgs.v",
            "spec/kubelet/extraArgs",
            json!({"v": INJECTION}),
        ),
        (
            "sysctl names must be on the allowlist",
            "spec/sysctls",
            json!({"kernel.core_pattern": "|/tmp/x"}),
        ),
    ];
    for (message, path, value) in &attempts {
        let bad = machine_with(host, |m| {
            let field = path.split('/').fold(m, |at, key| &mut at[key]);
            *field = value.clone();
        });
        match api.create(&PostParams::default(), &bad).await {
            Err(kube::Error::Api(status)) => {
                assert!(
                    status.message.contains(message),
                    "{message}: {}",
                    status.message
                )
            }
            other => panic!("{message}: the API server did not refuse it: {other:?}"),
        }
    }

    // A valid value with every character a unit line treats specially.
    let valid = machine_with(host, |m| {
        m["spec"]["kubelet"]["extraArgs"] = json!({"kok-note": TRICKY});
        m["spec"]["kubelet"]["nodeLabels"] =
            json!({"pool": "general", "example.com/tier": "gold_1.x"});
    });
    apply(&api, &valid).await;
    let _operator = h.operator();
    wait_ready(&api, host.name(), Duration::from_secs(300)).await;

    let unit = on(host, "cat /etc/systemd/system/kubelet.service");
    let directives: Vec<&str> = unit
        .lines()
        .filter(|l| l.contains('=') && !l.starts_with('#'))
        .map(|l| l.split('=').next().unwrap_or_default())
        .collect();
    assert_eq!(
        directives,
        [
            "Description",
            "After",
            "Requires",
            "ExecStart",
            "Restart",
            "WantedBy"
        ],
        "{unit}"
    );
    assert!(
        unit.contains(r#" --kok-note="a b \"c\" 'd' $$HOME $${HOME} 50%% %%n \\x""#),
        "{unit}"
    );
    assert!(
        unit.contains(r#"--node-labels="example.com/tier=gold_1.x,"#),
        "{unit}"
    );

    // The running kubelet got the value as one argument, unexpanded.
    let pid = on(host, "systemctl show -p MainPID --value kubelet.service");
    let argv = on(host, &format!("tr '\\0' '\\n' < /proc/{pid}/cmdline"));
    let args: Vec<&str> = argv.lines().collect();
    assert!(
        args.contains(&format!("--kok-note={TRICKY}").as_str()),
        "{args:#?}"
    );
    assert!(on(host, "ls /tmp/pwned 2>&1").contains("No such file"));
}
