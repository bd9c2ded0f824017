#!/usr/bin/env bash
# Runs the upstream Kubernetes conformance suite against a business cluster the
# operators make, the way Sonobuoy runs it: e2e.test of the pinned release,
# unmodified (scripts/testenv-bins.sh --e2e), the [Conformance] specs in a
# parallel pass (ginkgo --procs) without the [Serial] ones, then the
# [Serial] ones alone. The test images come from the local registry under
# their upstream names (scripts/node-images.sh --e2e), so no image flag or
# KUBE_TEST_REPO_LIST is needed.
#
# The cluster is the dev environment's (kok-dev-env, as scripts/dev-env.sh
# starts it) with the examples but only the example Cluster named by
# --cluster (the other would only take the machine's CPU): that Cluster with
# its example worker, plus the spare host joined as a second worker with
# spare-workers.yaml, as a user would. Everything is stopped at the end.
# With --env DIR the suite runs against a dev environment already running
# with --dir DIR (the dev environment's test does this): nothing is started,
# joined or stopped, and the Cluster has the workers it has there.
# Each spec is named in the output as it ends (ginkgo -v), so a run stopped
# early still says what ran.
#
# Writes to --out (default target/conformance): junit_*.xml per pass, the
# suite's output, and summary.md (passed, failed with the failure's first
# line, skipped), and prints the summary.
#
# It exits non-zero when the suite fails: a spec failed (on every attempt),
# or the suite failed outside any spec (its set-up finding no schedulable
# node, say), which no report counts.
#
# --flake-attempts N runs a failed spec up to N times in all (ginkgo's
# --flake-attempts); a spec that passes only on a later attempt counts as
# passed and is listed apart, under "Passed on a retry", with its attempts.
# The default, 1, is what a conformance result is: one attempt each.
#
#   scripts/conformance.sh                              # every [Conformance] spec
#   scripts/conformance.sh --focus 'sig-network.*Services'  # within those
#   scripts/conformance.sh --cluster clusters/prod-east --procs 2
#   scripts/conformance.sh --env /tmp/dev --focus 'sig-node.*Pods'  # a running one
#   scripts/conformance.sh --flake-attempts 2           # a failed spec once more
set -euo pipefail
cd "$(dirname "$0")/.."
# Cargo's target directory is cached outside the repository, as
# scripts/test.sh keeps it, so the two share their builds.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${KOK_TESTENV_DIR:-$HOME/.cache/kube-on-kube}/target}

cluster=default/ci
focus=''
skip=''
procs=4
out=target/conformance
serial=yes
env_dir=''
attempts=1
while [ $# -gt 0 ]; do
  case $1 in
    --cluster) cluster=$2; shift 2 ;;
    --focus) focus=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --procs) procs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-serial) serial=no; shift ;;
    --env) env_dir=$2; shift 2 ;;
    --flake-attempts) attempts=$2; shift 2 ;;
    -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
name=${cluster#*/}

log() { echo "[conformance $(date +%H:%M:%S)] $*" >&2; }
# The commit the operators are built from, taken now: the tree may move on
# while the suite runs.
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- crates Cargo.toml Cargo.lock 2>/dev/null || commit="$commit+changes"
if [ -x scripts/testhost-deps.sh ]; then scripts/testhost-deps.sh; fi
KOK_TESTENV_BIN_DIR=$(scripts/testenv-bins.sh --e2e | tail -n 1)
export KOK_TESTENV_BIN_DIR
scripts/node-software.sh "$CARGO_TARGET_DIR/node-software-logs"
scripts/node-images.sh --e2e >/dev/null
bin=$KOK_TESTENV_BIN_DIR
export PATH="$bin:$PATH"
rm -rf "$out" && mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ -n "$env_dir" ]; then
  kc="$env_dir/$name.kubeconfig"
  [ -f "$kc" ] || { echo "no $kc: is a dev environment running with --dir $env_dir, with $cluster?" >&2; exit 2; }
  log "the running dev environment's $cluster ($kc)"
else
  # KOK_DEV_OPERATORS_DIR names a directory where the workspace's binaries
  # are built already (scripts/test.sh's build): then nothing is built here.
  if [ -n "${KOK_DEV_OPERATORS_DIR:-}" ]; then
    target=$KOK_DEV_OPERATORS_DIR
  else
    cargo build --bin kube-on-kube-operator --bin node-operator --bin kubectl-kok \
      --bin kok-dev-env --bin kok-pod-exec --bin kok-testhost
    target=$CARGO_TARGET_DIR/debug
  fi
  mkdir -p "$out/env" "$out/examples"
  # The examples without the other Clusters.
  python3 - "$cluster" examples "$out/examples" <<'PY'
import glob, os, re, sys
cluster, src, dst = sys.argv[1:4]
found = False
field = lambda text, pattern: (re.search(pattern, text, re.M) or [None, None])[1]
for path in sorted(glob.glob(os.path.join(src, "*.yaml")) + glob.glob(os.path.join(src, "*.yml"))):
    # Each document's own text is kept as written; only other Clusters go
    # (top-level `kind:`, and `name:`/`namespace:` under metadata).
    kept = []
    for text in re.split(r"(?m)^---[ \t]*$", open(path).read()):
        if not re.search(r"(?m)^[^#\s]", text):
            continue
        if field(text, r"^kind:\s*(\S+)") == "Cluster":
            name = field(text, r"^  name:\s*(\S+)")
            namespace = field(text, r"^  namespace:\s*(\S+)") or "default"
            if f"{namespace}/{name}" != cluster:
                continue
            found = True
        kept.append(text.strip("\n"))
    if kept:
        with open(os.path.join(dst, os.path.basename(path)), "w") as f:
            f.write("\n---\n".join(kept) + "\n")
if not found:
    sys.exit(f"no example Cluster {cluster} in {src}/")
PY
  log "starting the dev environment (its output: $out/env.log)"
  "$target/kok-dev-env" --dir "$out/env" --examples "$out/examples" --operators-dir "$target" \
    --workers-cluster "$cluster" --spare-hosts 1 >"$out/env.log" 2>&1 &
  envpid=$!
  stop_env() {
    kill -INT $envpid 2>/dev/null || return 0
    log "stopping the dev environment"
    wait $envpid 2>/dev/null || true
  }
  trap stop_env EXIT
  for _ in $(seq 900); do
    grep -q 'every example converged' "$out/env.log" && break
    kill -0 $envpid 2>/dev/null || { tail -30 "$out/env.log" >&2; log "the dev environment ended"; exit 1; }
    sleep 1
  done
  grep -q 'every example converged' "$out/env.log" || { tail -30 "$out/env.log" >&2; exit 1; }
  kc="$out/env/$name.kubeconfig"
  log "joining the spare host to $cluster"
  kubectl --kubeconfig "$kc" apply -f "$out/env/spare-workers.yaml" >&2
  kubectl --kubeconfig "$kc" wait --for=condition=Ready machine/spare-0 --timeout=10m >&2
  kubectl --kubeconfig "$kc" wait --for=condition=Ready node --all --timeout=5m >&2
fi
kubectl --kubeconfig "$kc" get nodes -o wide >&2

common=(--kubeconfig="$kc" --provider=skeleton --disable-log-dump)
pattern='\[Conformance\]'
[ -z "$focus" ] || pattern="($pattern.*($focus))|(($focus).*$pattern)"
started=$(date +%s)
# The suite's own verdict: it fails for a failed spec, and for a failure
# outside any spec (a suite set-up that finds no ready node), which the
# reports count nowhere.
parallel_status=0
serial_status=0
log "parallel pass: --ginkgo.focus='$pattern' --ginkgo.skip='\\[Serial\\]${skip:+|$skip}' with $procs processes"
mkdir -p "$out/parallel"
ginkgo --procs="$procs" --timeout=4h -v --flake-attempts="$attempts" \
  --json-report=report.json --output-dir="$out/parallel" "$bin/e2e.test" -- "${common[@]}" \
  --report-dir="$out/parallel" --ginkgo.focus="$pattern" \
  --ginkgo.skip="\[Serial\]${skip:+|$skip}" >"$out/parallel.log" 2>&1 || parallel_status=$?
if [ $serial = yes ]; then
  log "serial pass: the [Serial] ones among them"
  mkdir -p "$out/serial"
  "$bin/e2e.test" "${common[@]}" --report-dir="$out/serial" --ginkgo.v --ginkgo.flake-attempts="$attempts" \
    --ginkgo.json-report="$out/serial/report.json" --ginkgo.focus="\[Serial\].*($pattern)" \
    ${skip:+--ginkgo.skip="$skip"} --ginkgo.timeout=4h >"$out/serial.log" 2>&1 || serial_status=$?
fi
took=$(( $(date +%s) - started ))

python3 - "$out" "$took" "$commit" "$cluster" <<'PY'
import glob, json, os, sys, xml.etree.ElementTree as ET
out, took, commit, cluster = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
passed, failed, skipped = [], [], []
for path in sorted(glob.glob(os.path.join(out, "*", "junit_*.xml"))):
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if "[Conformance]" not in name:
            continue
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skip = case.find("skipped")
        if failure is not None:
            text = (failure.get("message") or failure.text or "").strip().splitlines()
            failed.append((name, text[0] if text else ""))
        elif skip is not None:
            # Specs the focus left out are reported as skipped too; only
            # those the suite itself skipped carry a reason worth listing.
            reason = (skip.get("message") or "").strip()
            if reason and reason != "skipped":
                skipped.append((name, reason.splitlines()[0]))
        else:
            passed.append(name)
# Passed only on a later attempt (--flake-attempts): ginkgo's JSON report
# has each spec's attempts; its JUnit report does not say.
retried = []
for path in sorted(glob.glob(os.path.join(out, "*", "report.json"))):
    try:
        reports = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        continue
    for report in reports if isinstance(reports, list) else []:
        for spec in report.get("SpecReports") or []:
            attempts = spec.get("NumAttempts") or 1
            if spec.get("State") == "passed" and attempts > 1:
                texts = (spec.get("ContainerHierarchyTexts") or []) + [spec.get("LeafNodeText") or ""]
                retried.append((" ".join(t for t in texts if t), attempts))
lines = [
    f"# Conformance of `{cluster}` at `{commit}`",
    "",
    f"{len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped; "
    f"{took // 60} min {took % 60} s.",
    "",
]
if failed:
    lines += ["## Failed", "", "| spec | first line of the failure |", "| --- | --- |"]
    lines += [f"| {n} | {m.replace('|', '/')} |" for n, m in failed] + [""]
if retried:
    lines += ["## Passed on a retry", "", "| spec | attempts |", "| --- | --- |"]
    lines += [f"| {n} | {a} |" for n, a in retried] + [""]
if skipped:
    lines += ["## Skipped", "", "| spec | reason |", "| --- | --- |"]
    lines += [f"| {n} | {m.replace('|', '/')} |" for n, m in skipped] + [""]
lines += ["## Passed", ""] + [f"- {n}" for n in sorted(passed)] + [""]
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines))
print("\n".join(lines[:4]))
for n, m in failed:
    print(f"FAILED {n}: {m}")
for n, a in retried:
    print(f"PASSED ON ATTEMPT {a}: {n}")
PY
log "summary: $out/summary.md"
if [ "$parallel_status" -ne 0 ] || [ "$serial_status" -ne 0 ]; then
  logs="$out/parallel.log"
  [ $serial = no ] || logs="$logs and $out/serial.log"
  log "the suite failed (parallel pass: exit $parallel_status, serial pass: exit $serial_status): a failed spec in the summary, or a failure outside any spec; see $logs"
  exit 1
fi
