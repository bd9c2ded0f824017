//! `kok-dev-env`: both operators running against a local meta-cluster and
//! business cluster with the examples applied, so a change can be tried by hand
//! with kubectl in one command (`scripts/dev-env.sh`).

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};

use kok_testenv::bins;
use kok_testenv::kube_env::{KubeEnv, Options};

/// Runs a meta-cluster and a business cluster from the test environment (real
/// etcd, kube-apiserver and kube-controller-manager; the meta-cluster also has
/// kube-scheduler and three kwok nodes, so control-plane Pods get scheduled and
/// turn Running), applies the examples to them, and runs kube-on-kube-operator
/// against the meta-cluster and node-operator against the business cluster until
/// Ctrl-C or SIGTERM.
///
/// The upstream binaries come from $KOK_TESTENV_BIN_DIR, or from
/// scripts/testenv-bins.sh when it is unset. Everything runs in the
/// foreground; stopping this program stops the operators and both clusters
/// and deletes the clusters' data.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Directory for meta.kubeconfig, business.kubeconfig and the operator logs;
    /// created when missing, files from an earlier run are overwritten.
    #[arg(long, env = "KOK_DEV_DIR", default_value = ".kok-dev")]
    dir: PathBuf,
    /// Directory whose *.yaml and *.yml files are applied with server-side apply: Cluster
    /// objects to the meta-cluster, everything else to the business cluster.
    /// Namespaces they name are created first.
    #[arg(long, env = "KOK_DEV_EXAMPLES", default_value = "examples")]
    examples: PathBuf,
    /// Directory holding the kube-on-kube-operator and node-operator binaries
    /// (and kubectl-kok, for the commands the banner suggests).
    #[arg(long, env = "KOK_DEV_OPERATORS_DIR", default_value = "target/debug")]
    operators_dir: PathBuf,
    /// Stop by itself this many seconds after everything is up, as if
    /// interrupted (0: run until Ctrl-C or SIGTERM).
    #[arg(
        long,
        env = "KOK_DEV_EXIT_AFTER",
        default_value_t = 0,
        value_name = "SECONDS"
    )]
    exit_after: u64,
    /// HTTP endpoint (/healthz, /readyz, /metrics, /debug/loglevel) of the
    /// kube-on-kube-operator. The two operators run side by side, so each needs
    /// its own port; port 0 picks a free one (the operator logs it).
    #[arg(
        long,
        env = "KOK_DEV_META_OPERATOR_HTTP",
        default_value = "127.0.0.1:8080"
    )]
    meta_operator_http: std::net::SocketAddr,
    /// HTTP endpoint of the node-operator (see --meta-operator-http).
    #[arg(
        long,
        env = "KOK_DEV_NODE_OPERATOR_HTTP",
        default_value = "127.0.0.1:8081"
    )]
    node_operator_http: std::net::SocketAddr,
}

/// The meta-cluster runs Cluster control planes as Pods, which need a scheduler
/// and nodes to reach Running.
const META: Options = Options {
    controller_manager: true,
    scheduler: true,
    kwok_nodes: 3,
    install_crds: true,
    controller_manager_qps: None,
};

/// The business cluster only holds objects for node-operator; its Nodes would
/// come from real Machines.
const BUSINESS: Options = Options {
    controller_manager: true,
    scheduler: false,
    kwok_nodes: 0,
    install_crds: true,
    controller_manager_qps: None,
};

const META_OPERATOR: &str = "kube-on-kube-operator";
const BUSINESS_OPERATOR: &str = "node-operator";

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kok-dev-env: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<ExitCode> {
    // Everything that can be wrong without a cluster is checked before spending
    // a minute starting two of them.
    let meta_operator = operator_binary(&args.operators_dir, META_OPERATOR)?;
    let business_operator = operator_binary(&args.operators_dir, BUSINESS_OPERATOR)?;
    let documents = examples::load(&args.examples)?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;

    say("starting the meta-cluster and the business cluster");
    let (meta, business) = start_clusters()?;
    let meta_kubeconfig = args.dir.join("meta.kubeconfig");
    let business_kubeconfig = args.dir.join("business.kubeconfig");
    copy_private(meta.kubeconfig_path(), &meta_kubeconfig)?;
    copy_private(business.kubeconfig_path(), &business_kubeconfig)?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the async runtime")?;
    let clusters = Clusters {
        meta: Cluster {
            env: &meta,
            kubeconfig: meta_kubeconfig,
            operator: meta_operator,
        },
        business: Cluster {
            env: &business,
            kubeconfig: business_kubeconfig,
            operator: business_operator,
        },
    };
    // The current-thread runtime runs on this thread, which lives as long as the
    // process: the operators' parent-death signal is tied to the thread that
    // forked them.
    runtime.block_on(serve(args, &clusters, &documents))
    // `meta` and `business` are dropped on return, which stops their processes.
}

/// One of the two clusters and the operator that watches it.
struct Cluster<'a> {
    env: &'a KubeEnv,
    /// The copy of the admin kubeconfig in `--dir`.
    kubeconfig: PathBuf,
    operator: PathBuf,
}

struct Clusters<'a> {
    meta: Cluster<'a>,
    business: Cluster<'a>,
}

/// Why the environment stopped.
enum Stop {
    Signal(&'static str),
    Deadline,
    OperatorExited(&'static str, std::process::ExitStatus),
}

async fn serve(
    args: &Args,
    clusters: &Clusters<'_>,
    documents: &[examples::Document],
) -> anyhow::Result<ExitCode> {
    let (to_meta, to_business): (Vec<_>, Vec<_>) =
        documents.iter().partition(|d| examples::belongs_to_meta(d));
    let meta_client = client(clusters.meta.env).await?;
    let business_client = client(clusters.business.env).await?;
    tokio::try_join!(
        examples::apply(&meta_client, "meta-cluster", &to_meta),
        examples::apply(&business_client, "business cluster", &to_business),
    )?;

    // From here on a Ctrl-C is handled rather than fatal, so the operators get to
    // shut down; before, the default action ends everything just as well.
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;

    let mut meta_operator = operator::Running::spawn(
        META_OPERATOR,
        &clusters.meta.operator,
        &clusters.meta.kubeconfig,
        args.meta_operator_http,
        &args.dir,
    )?;
    let mut business_operator = operator::Running::spawn(
        BUSINESS_OPERATOR,
        &clusters.business.operator,
        &clusters.business.kubeconfig,
        args.node_operator_http,
        &args.dir,
    )?;
    out(&banner(
        args,
        clusters,
        &[meta_operator.log(), business_operator.log()],
    ));

    let deadline = async {
        match args.exit_after {
            0 => std::future::pending().await,
            secs => tokio::time::sleep(Duration::from_secs(secs)).await,
        }
    };
    let stop = tokio::select! {
        _ = interrupt.recv() => Stop::Signal("SIGINT"),
        _ = terminate.recv() => Stop::Signal("SIGTERM"),
        () = deadline => Stop::Deadline,
        status = meta_operator.wait() => Stop::OperatorExited(META_OPERATOR, status?),
        status = business_operator.wait() => Stop::OperatorExited(BUSINESS_OPERATOR, status?),
    };
    let code = match stop {
        Stop::Signal(name) => {
            say(&format!("{name}: stopping"));
            ExitCode::SUCCESS
        }
        Stop::Deadline => {
            say(&format!("{}s are up: stopping", args.exit_after));
            ExitCode::SUCCESS
        }
        Stop::OperatorExited(name, status) => {
            let log = if name == META_OPERATOR {
                meta_operator.log()
            } else {
                business_operator.log()
            };
            eprintln!(
                "kok-dev-env: {name} exited unexpectedly ({status}); its log is {}",
                log.display()
            );
            ExitCode::FAILURE
        }
    };
    // The node-operator first: it may still be acting on what the other one serves.
    business_operator.stop().await;
    meta_operator.stop().await;
    say("stopping the clusters");
    Ok(code)
}

/// An admin client; unlike [`KubeEnv::client`], reports failure as an error.
async fn client(env: &KubeEnv) -> anyhow::Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        env.kubeconfig().clone(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .with_context(|| format!("loading the kubeconfig of {}", env.api_url()))?;
    kube::Client::try_from(config)
        .with_context(|| format!("building a client for {}", env.api_url()))
}

/// Starts both clusters at once: each start is mostly waiting on its own
/// processes.
fn start_clusters() -> anyhow::Result<(KubeEnv, KubeEnv)> {
    std::thread::scope(|scope| {
        let meta = scope.spawn(|| KubeEnv::start(META));
        let business = scope.spawn(|| KubeEnv::start(BUSINESS));
        let meta = join(meta).context("starting the meta-cluster");
        let business = join(business).context("starting the business cluster");
        Ok((meta?, business?))
    })
}

fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    match handle.join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn operator_binary(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} does not exist; build the operators with `cargo build --bins` \
             (scripts/dev-env.sh does) or point --operators-dir at them",
            path.display()
        );
    }
    Ok(path)
}

/// Copies a kubeconfig readable by the owner only: it holds the admin key.
fn copy_private(from: &Path, to: &Path) -> anyhow::Result<()> {
    let contents = std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(to)?;
        // `mode` applies to new files only; one left by an earlier run is fixed too.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(&contents)
    };
    write().with_context(|| format!("writing {}", to.display()))
}

/// What to do next, printed once everything runs.
/// Where an operator's /metrics is, as the banner shows it.
fn endpoint(address: std::net::SocketAddr) -> String {
    if address.port() == 0 {
        "a free port named in its log".to_owned()
    } else {
        format!("http://{address}/metrics")
    }
}

fn banner(args: &Args, clusters: &Clusters<'_>, operator_logs: &[&Path]) -> String {
    let meta = clusters.meta.kubeconfig.display();
    let business = clusters.business.kubeconfig.display();
    let mut path = Vec::new();
    for dir in [
        std::fs::canonicalize(&args.operators_dir).ok(),
        bins::bin_dir().ok(),
    ]
    .into_iter()
    .flatten()
    {
        path.push(dir.display().to_string());
    }
    let logs: Vec<String> = operator_logs
        .iter()
        .map(|l| l.display().to_string())
        .collect();
    let stop = match args.exit_after {
        0 => "Ctrl-C stops the operators and both clusters (the clusters' data is not kept)."
            .to_owned(),
        secs => format!("Stops by itself in {secs}s (--exit-after)."),
    };
    format!(
        "\n\
         kube-on-kube dev environment is up.\n\
         \n\
         \x20 meta-cluster      {meta_url}  kubeconfig {meta}\n\
         \x20 business cluster  {business_url}  kubeconfig {business}\n\
         \n\
         Try (kubectl is next to the other upstream binaries, kubectl-kok next to the operators):\n\
         \x20 export PATH={path}:$PATH\n\
         \x20 kubectl --kubeconfig {meta} get clusters -A\n\
         \x20 kubectl --kubeconfig {meta} get pods -n clusters\n\
         \x20 kubectl --kubeconfig {business} get kok\n\
         \x20 kubectl kok --kubeconfig {meta} cluster list -A\n\
         \x20 kubectl kok --kubeconfig {business} machine list\n\
         \n\
         Logs:\n\
         \x20 operators         {logs} (also below, prefixed with their name)\n\
         \n\
         Metrics and probes: {meta_http} (kube-on-kube-operator), {node_http} (node-operator)\n\
         \x20 meta-cluster      {meta_logs}\n\
         \x20 business cluster  {business_logs}\n\
         \n\
         {stop}\n",
        meta_url = clusters.meta.env.api_url(),
        business_url = clusters.business.env.api_url(),
        path = path.join(":"),
        logs = logs.join(", "),
        meta_http = endpoint(args.meta_operator_http),
        node_http = endpoint(args.node_operator_http),
        meta_logs = clusters.meta.env.log_dir().display(),
        business_logs = clusters.business.env.log_dir().display(),
    )
}

/// A line of this program's own, told apart from the operators' output.
fn say(message: &str) {
    out(&format!("kok-dev-env: {message}\n"));
}

/// Writes to stdout in one piece so operator lines never land inside it; a
/// closed stdout is no reason to stop the environment.
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

mod examples {
    //! The example documents and where each goes: Cluster objects describe
    //! business clusters and live in the meta-cluster; every other kind lives in
    //! the business cluster it configures.

    use std::collections::BTreeSet;
    use std::path::Path;
    use std::time::{Duration, Instant};

    use anyhow::{Context as _, bail};
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
    use kube::discovery::{self, ApiCapabilities, ApiResource, Scope};
    use kube::{Client, Resource as _};
    use serde::Deserialize as _;

    use super::say;

    /// The field manager of everything this program applies.
    const MANAGER: &str = "kok-dev-env";

    /// A freshly Established CRD can take a moment to show up in discovery.
    const DISCOVERY_WAIT: Duration = Duration::from_secs(30);

    pub(crate) struct Document {
        /// The file it came from, for messages.
        file: String,
        gvk: GroupVersionKind,
        object: DynamicObject,
    }

    impl Document {
        fn name(&self) -> &str {
            self.object.metadata.name.as_deref().unwrap_or_default()
        }
    }

    pub(crate) fn belongs_to_meta(doc: &Document) -> bool {
        doc.gvk.group == kube_on_kube_api::Cluster::group(&())
            && doc.gvk.kind == kube_on_kube_api::Cluster::kind(&())
    }

    /// Every document of every `*.yaml`/`*.yml` file in `dir`, in file name order.
    pub(crate) fn load(dir: &Path) -> anyhow::Result<Vec<Document>> {
        let entries =
            std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        let mut files = Vec::new();
        for entry in entries {
            let path = entry
                .with_context(|| format!("reading {}", dir.display()))?
                .path();
            if path
                .extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
            {
                files.push(path);
            }
        }
        files.sort();
        let mut documents = Vec::new();
        for path in files {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let file = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            for (index, yaml) in serde_norway::Deserializer::from_str(&text).enumerate() {
                let value = serde_json::Value::deserialize(yaml)
                    .with_context(|| format!("{}: document {}", path.display(), index + 1))?;
                if value.is_null() {
                    continue;
                }
                let document = parse(&file, value)
                    .with_context(|| format!("{}: document {}", path.display(), index + 1))?;
                documents.push(document);
            }
        }
        if documents.is_empty() {
            bail!("{} holds no YAML documents", dir.display());
        }
        Ok(documents)
    }

    fn parse(file: &str, value: serde_json::Value) -> anyhow::Result<Document> {
        let object: DynamicObject = serde_json::from_value(value)?;
        let Some(types) = &object.types else {
            bail!("apiVersion and kind are required");
        };
        let gvk = GroupVersionKind::try_from(types)?;
        if object
            .metadata
            .name
            .as_deref()
            .unwrap_or_default()
            .is_empty()
        {
            bail!("metadata.name is required");
        }
        Ok(Document {
            file: file.to_owned(),
            gvk,
            object,
        })
    }

    /// Server-side applies `documents` to one cluster, after creating the
    /// namespaces they name.
    pub(crate) async fn apply(
        client: &Client,
        cluster: &str,
        documents: &[&Document],
    ) -> anyhow::Result<()> {
        let mut resolved = Vec::new();
        for doc in documents {
            let (resource, caps) = resolve(client, &doc.gvk)
                .await
                .with_context(|| format!("finding {} in the {cluster}'s API", doc.gvk.kind))?;
            let namespace = match caps.scope {
                Scope::Namespaced => Some(
                    doc.object
                        .metadata
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".to_owned()),
                ),
                Scope::Cluster => None,
            };
            resolved.push((doc, resource, namespace));
        }

        let params = PatchParams::apply(MANAGER).force();
        let namespaces: BTreeSet<&str> = resolved
            .iter()
            .filter_map(|(_, _, ns)| ns.as_deref())
            .collect();
        let namespace_api: Api<Namespace> = Api::all(client.clone());
        for name in namespaces {
            let namespace = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name},
            });
            namespace_api
                .patch(name, &params, &Patch::Apply(&namespace))
                .await
                .with_context(|| format!("creating namespace {name} in the {cluster}"))?;
        }

        for (doc, resource, namespace) in resolved {
            let (api, shown) = match &namespace {
                Some(ns) => (
                    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource),
                    format!("{ns}/{}", doc.name()),
                ),
                None => (
                    Api::all_with(client.clone(), &resource),
                    doc.name().to_owned(),
                ),
            };
            api.patch(doc.name(), &params, &Patch::Apply(&doc.object))
                .await
                .with_context(|| {
                    format!(
                        "applying {} {shown} from {} to the {cluster}",
                        doc.gvk.kind, doc.file
                    )
                })?;
            say(&format!(
                "applied {} {shown} ({}) to the {cluster}",
                doc.gvk.kind, doc.file
            ));
        }
        Ok(())
    }

    async fn resolve(
        client: &Client,
        gvk: &GroupVersionKind,
    ) -> Result<(ApiResource, ApiCapabilities), kube::Error> {
        let deadline = Instant::now() + DISCOVERY_WAIT;
        loop {
            match discovery::pinned_kind(client, gvk).await {
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                found => return found,
            }
        }
    }
}

mod operator {
    //! The operators as child processes. Each leads its own process group, so a
    //! Ctrl-C in the terminal reaches only this program, which then stops them
    //! with SIGTERM and waits; the kernel kills them should this program die
    //! without doing so.

    use std::io::{IsTerminal as _, Write as _};
    use std::path::{Path, PathBuf};
    use std::process::{ExitStatus, Stdio};
    use std::time::Duration;

    use anyhow::Context as _;
    use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
    use tokio::process::{Child, Command};
    use tokio::task::JoinHandle;

    use super::out;
    use kok_testenv::operator_http::strip_ansi;

    /// Both operators shut down on SIGTERM within a second or two; beyond this
    /// one is stuck and gets SIGKILL.
    const STOP_GRACE: Duration = Duration::from_secs(15);

    /// How long the last lines of a stopped operator may take to be printed.
    const DRAIN: Duration = Duration::from_secs(2);

    pub(crate) struct Running {
        name: &'static str,
        child: Child,
        log: PathBuf,
        forwarders: Vec<JoinHandle<()>>,
    }

    impl Running {
        /// Starts `binary --kubeconfig <kubeconfig> --http-address <http>`, its
        /// output going to `<log_dir>/<name>.log` and, prefixed with its name,
        /// to stdout.
        pub(crate) fn spawn(
            name: &'static str,
            binary: &Path,
            kubeconfig: &Path,
            http: std::net::SocketAddr,
            log_dir: &Path,
        ) -> anyhow::Result<Running> {
            let log = log_dir.join(format!("{name}.log"));
            let file = std::fs::File::create(&log)
                .with_context(|| format!("creating {}", log.display()))?;
            let mut command = Command::new(binary);
            command
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .arg(format!("--http-address={http}"))
                // A context from the caller's environment would not exist in
                // this kubeconfig.
                .env_remove("KOK_CONTEXT")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            if !std::io::stdout().is_terminal() {
                command.env("NO_COLOR", "1");
            }
            let parent = std::process::id();
            // SAFETY: the closure runs between fork and exec and only makes
            // async-signal-safe calls (prctl, getppid); it allocates nothing.
            unsafe {
                command.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // The parent may have died before the request above was in place.
                    if u32::try_from(libc::getppid()).ok() != Some(parent) {
                        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    Ok(())
                });
            }
            let mut child = command
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            let mut forwarders = Vec::new();
            if let Some(stdout) = child.stdout.take() {
                let file = file
                    .try_clone()
                    .with_context(|| format!("opening {}", log.display()))?;
                forwarders.push(tokio::spawn(forward(name, stdout, file)));
            }
            if let Some(stderr) = child.stderr.take() {
                forwarders.push(tokio::spawn(forward(name, stderr, file)));
            }
            Ok(Running {
                name,
                child,
                log,
                forwarders,
            })
        }

        pub(crate) fn log(&self) -> &Path {
            &self.log
        }

        /// Resolves when the process has exited, however.
        pub(crate) async fn wait(&mut self) -> anyhow::Result<ExitStatus> {
            self.child
                .wait()
                .await
                .with_context(|| format!("waiting for {}", self.name))
        }

        /// SIGTERM, then SIGKILL after [`STOP_GRACE`]; a no-op once it has
        /// exited. Problems are reported, not returned: the other operator and
        /// the clusters still have to be stopped.
        pub(crate) async fn stop(&mut self) {
            if let Some(pid) = self
                .child
                .id()
                .and_then(|pid| libc::pid_t::try_from(pid).ok())
            {
                // SAFETY: plain system call. The child is not reaped yet (it has
                // an id), so the pid cannot belong to another process.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
            match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => eprintln!("kok-dev-env: waiting for {}: {e}", self.name),
                Err(_) => {
                    eprintln!(
                        "kok-dev-env: {} did not stop within {STOP_GRACE:?}; killing it",
                        self.name
                    );
                    if let Err(e) = self.child.kill().await {
                        eprintln!("kok-dev-env: killing {}: {e}", self.name);
                    }
                }
            }
            for forwarder in self.forwarders.drain(..) {
                let _ = tokio::time::timeout(DRAIN, forwarder).await;
            }
        }
    }

    /// Copies `stream` line by line to `log` and, prefixed, to stdout. Lines are
    /// read as bytes: a stray invalid UTF-8 byte must not end the forwarding.
    async fn forward(name: &'static str, stream: impl AsyncRead + Unpin, mut log: std::fs::File) {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            let _ = writeln!(log, "{}", strip_ansi(text));
            out(&format!("[{name}] {text}\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use kok_testenv::operator_http::strip_ansi;

    #[test]
    fn strips_colour_sequences() {
        assert_eq!(
            strip_ansi("\u{1b}[32m INFO\u{1b}[0m \u{1b}[2mnode_operator\u{1b}[0m: connected to"),
            " INFO node_operator: connected to"
        );
        assert_eq!(strip_ansi("plain [text]"), "plain [text]");
    }
}
