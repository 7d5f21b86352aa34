#!/usr/bin/env bash
# Provision a Docker engine and the codemode worker image on a Debian (bookworm) machine.
#
# Idempotent: CI runs it before the test suite and a developer can run it by hand (as root).
#
#   1. install docker.io and debootstrap from Debian (skipped when present);
#   2. start dockerd in the background when `docker info` fails (log: /var/log/dockerd.log);
#   3. build the offline base image codemode-base:bookworm with debootstrap: minbase plus python3,
#      python3-seccomp (libseccomp's Python binding, which the worker confines itself with) and
#      libatomic1 (regopy's, for the Rego authorizer in the service image built from it); cached:
#      skipped when the image exists with that package list (label io.codemode.base.packages);
#      CODEMODE_REBUILD_BASE=1 forces a rebuild;
#   4. fetch the worker's pinned wheels (worker_image/requirements.txt) on the host and build
#      codemode-worker:1 (the production target: interpreter, libraries and worker only) and
#      codemode-worker-testing:1 (the same plus the test-only entry the escape tests use) from
#      worker_image/, its own build context (always; the Docker build cache makes this cheap);
#   5. smoke-test the image (probe -> probe_ack under the runtime's hardening flags);
#   6. optionally (CODEMODE_GVISOR=auto|1|0, default auto) install gVisor's runsc from Debian,
#      register it with dockerd as runtime "runsc" and verify it runs a worker with --network=none.
#      With auto, a failure only prints a warning: runsc stays optional.
#
# Environment knobs:
#   CODEMODE_CACHE_DIR     default /var/cache/codemode (wheel cache, build staging)
#   CODEMODE_BASE_IMAGE    default codemode-base:bookworm
#   CODEMODE_WORKER_IMAGE  default codemode-worker:1 (tag = protocol version)
#   CODEMODE_TESTING_IMAGE default codemode-worker-testing:1 (escape tests only; never deploy it)
#   CODEMODE_DEBIAN_MIRROR default: the first Debian mirror apt uses on this machine
#   CODEMODE_GVISOR        auto (default) | 1 (required) | 0 (skip)
#   CODEMODE_REBUILD_BASE  1 to rebuild the base image even when it exists
#   PYTHON                 python used to fetch wheels (default: python3 with pip, else .venv)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_DIR="${CODEMODE_CACHE_DIR:-/var/cache/codemode}"
BASE_IMAGE="${CODEMODE_BASE_IMAGE:-codemode-base:bookworm}"
WORKER_IMAGE="${CODEMODE_WORKER_IMAGE:-codemode-worker:1}"
TESTING_IMAGE="${CODEMODE_TESTING_IMAGE:-codemode-worker-testing:1}"
GVISOR="${CODEMODE_GVISOR:-auto}"
DOCKERD_LOG=/var/log/dockerd.log
SUITE=bookworm
# What debootstrap adds to minbase (recorded in the base image's io.codemode.base.packages label).
BASE_PACKAGES=python3,python3-seccomp,libatomic1

log() { printf '[provision-docker] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

as_root() {
    if [ "$(id -u)" -ne 0 ]; then
        die "this step needs root: $*"
    fi
}

# --------------------------------------------------------------------------- 1. packages
apt_updated=0
apt_install() {
    as_root "apt-get install $*"
    if [ "$apt_updated" -eq 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need_pkgs=()
command -v dockerd >/dev/null 2>&1 || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need_pkgs+=(debootstrap)
# docker.io brings containerd and runc; ca-certificates for pip is normally present already.
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    log "installing ${need_pkgs[*]} from Debian"
    apt_install "${need_pkgs[@]}"
fi

# --------------------------------------------------------------------------- 2. dockerd
docker_ready() { timeout 10 docker info >/dev/null 2>&1; }

wait_docker() {
    local limit="${1:-60}" i
    for ((i = 0; i < limit; i++)); do
        docker_ready && return 0
        sleep 1
    done
    return 1
}

if ! docker_ready; then
    as_root "start dockerd"
    if pgrep -x dockerd >/dev/null 2>&1; then
        log "dockerd is running but not answering yet; waiting"
    else
        log "starting dockerd in the background (log: $DOCKERD_LOG)"
        # setsid: the daemon must outlive this script and must not get the caller's signals.
        setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
    fi
    if ! wait_docker 60; then
        tail -n 30 "$DOCKERD_LOG" >&2 || true
        die "dockerd did not become ready within 60 s"
    fi
fi
log "docker engine: $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"

# --------------------------------------------------------------------------- 3. offline base image
debian_mirror() {
    if [ -n "${CODEMODE_DEBIAN_MIRROR:-}" ]; then
        echo "$CODEMODE_DEBIAN_MIRROR"
        return
    fi
    local m=""
    # deb822 sources (URIs: ...) first, then one-line sources (deb URL suite ...).
    m="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' \
        | grep -E '/debian/?$' | head -n1 || true)"
    if [ -z "$m" ]; then
        m="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
            | awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; break}}' \
            | grep -E '/debian/?$' | head -n1 || true)"
    fi
    echo "${m:-http://deb.debian.org/debian}"
}

build_base_image() {
    as_root "debootstrap"
    local mirror work rootfs
    mirror="$(debian_mirror)"
    work="$(mktemp -d "${TMPDIR:-/tmp}/codemode-rootfs.XXXXXX")"
    rootfs="$work/rootfs"
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" RETURN
    log "debootstrap $SUITE (minbase + $BASE_PACKAGES) from $mirror"
    if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$mirror" \
        >"$work/debootstrap.log" 2>&1; then
        tail -n 30 "$work/debootstrap.log" >&2
        die "debootstrap failed"
    fi

    log "slimming the root filesystem"
    # Packages the worker never needs. Perl (and the perl-based debconf / init helpers), apt and the
    # account / filesystem tools go; dpkg's database stays so image scanners can list what is left.
    # The shell (dash/bash) and coreutils stay (Essential, and harmless): nothing runs them.
    local purge=(apt libapt-pkg6.0 perl-base debconf init-system-helpers adduser passwd login
        e2fsprogs libext2fs2 libss2 logsave gpgv debian-archive-keyring ncurses-bin
        libsemanage2 libsemanage-common libsepol2 sysvinit-utils)
    local present=() p
    for p in "${purge[@]}"; do
        # shellcheck disable=SC2016 # ${Status} is dpkg-query's format, not a shell variable
        if chroot "$rootfs" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q installed; then
            present+=("$p")
        fi
    done
    if [ "${#present[@]}" -gt 0 ]; then
        chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive dpkg --purge \
            --force-remove-essential --force-depends --force-remove-protected \
            "${present[@]}" >"$work/purge.log" 2>&1 || {
            tail -n 20 "$work/purge.log" >&2
            die "dpkg --purge failed"
        }
    fi
    rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/lintian "$rootfs"/usr/share/linda \
        "$rootfs"/usr/share/bash-completion "$rootfs"/usr/share/common-licenses \
        "$rootfs"/usr/lib/locale/* "$rootfs"/var/cache/apt "$rootfs"/var/lib/apt \
        "$rootfs"/var/cache/debconf "$rootfs"/var/cache/ldconfig/* "$rootfs"/var/log/* \
        "$rootfs"/usr/share/perl5 "$rootfs"/usr/lib/x86_64-linux-gnu/perl-base \
        "$rootfs"/usr/lib/python3.11/test "$rootfs"/usr/lib/python3.11/idlelib \
        "$rootfs"/usr/lib/python3.11/tkinter "$rootfs"/usr/lib/python3.11/turtledemo \
        "$rootfs"/usr/lib/python3.11/ensurepip "$rootfs"/usr/lib/python3.11/lib2to3 \
        "$rootfs"/tmp/* "$rootfs"/var/tmp/* "$rootfs"/root/.??* 2>/dev/null || true
    # No setuid/setgid programs in the image (no-new-privileges neutralizes them anyway).
    find "$rootfs" -xdev -type f -perm /6000 -exec chmod ug-s {} + 2>/dev/null || true
    # Smoke: the interpreter still starts and has what the worker needs.
    chroot "$rootfs" /usr/bin/python3 -I -c 'import json, struct, os, sys, select, signal, resource, seccomp' \
        || die "python3 is broken after slimming"

    log "importing $BASE_IMAGE ($(du -sh "$rootfs" | cut -f1))"
    tar --numeric-owner -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'LABEL io.codemode.role=base' \
        --change "LABEL io.codemode.base.suite=$SUITE" \
        --change "LABEL io.codemode.base.packages=$BASE_PACKAGES" \
        --change 'CMD ["/usr/bin/python3"]' \
        - "$BASE_IMAGE" >/dev/null
}

base_packages="$(docker image inspect "$BASE_IMAGE" \
    --format '{{index .Config.Labels "io.codemode.base.packages"}}' 2>/dev/null || true)"
if [ "${CODEMODE_REBUILD_BASE:-0}" != "1" ] && [ "$base_packages" = "$BASE_PACKAGES" ]; then
    log "base image $BASE_IMAGE present (cached)"
else
    build_base_image
fi

# --------------------------------------------------------------------------- 4. wheels + worker image
pick_python() {
    if [ -n "${PYTHON:-}" ]; then
        echo "$PYTHON"
        return
    fi
    local c
    for c in python3 "$REPO_ROOT/.venv/bin/python" /usr/bin/python3; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -m pip --version >/dev/null 2>&1; then
            echo "$c"
            return
        fi
    done
    die "no python with pip found to fetch the worker wheels (set PYTHON=...)"
}

REQS="$REPO_ROOT/worker_image/requirements.txt"
[ -f "$REQS" ] || die "missing $REQS"
PY="$(pick_python)"
req_hash="$(sha256sum "$REQS" | cut -c1-16)"
SITE_CACHE="$CACHE_DIR/site-$req_hash"
if [ ! -f "$SITE_CACHE/.complete" ]; then
    log "fetching worker wheels (cp311, binary only) into $SITE_CACHE"
    rm -rf "$SITE_CACHE"
    mkdir -p "$SITE_CACHE"
    "$PY" -m pip install --quiet --disable-pip-version-check --no-compile \
        --target "$SITE_CACHE" --only-binary=:all: --python-version 3.11 \
        --implementation cp -r "$REQS" \
        || die "pip could not fetch the worker wheels"
    rm -rf "${SITE_CACHE:?}/bin"
    find "$SITE_CACHE" -name __pycache__ -type d -prune -exec rm -rf {} +
    touch "$SITE_CACHE/.complete"
else
    log "worker wheels cached in $SITE_CACHE"
fi

STAGE="$(mktemp -d "${TMPDIR:-/tmp}/codemode-build.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
# Build context: a copy of worker_image/ (the image builds from its own folder, codemode_worker/
# included) with the pre-fetched site dir as site/, without caches.
tar -C "$REPO_ROOT/worker_image" --exclude=__pycache__ --exclude='*.pyc' --exclude=./site \
    -c . | tar -C "$STAGE" -x
mkdir -p "$STAGE/site"
cp -a "$SITE_CACHE/." "$STAGE/site/"
rm -f "$STAGE/site/.complete"

build_target() {
    local target="$1" image="$2"
    log "building $image (target $target) from $BASE_IMAGE (offline dependencies)"
    if ! docker build --quiet --force-rm \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        --build-arg DEPS=offline \
        --target "$target" \
        -t "$image" "$STAGE" >"$STAGE/build.log" 2>&1; then
        cat "$STAGE/build.log" >&2
        die "docker build --target $target failed"
    fi
    log "built $image ($(docker image inspect "$image" --format '{{.Size}}' \
        | awk '{printf "%.1f MiB", $1 / 1048576}'))"
}
build_target production "$WORKER_IMAGE"
build_target testing "$TESTING_IMAGE"

# --------------------------------------------------------------------------- 5. smoke test
# Hardened like DockerRuntime: probe frame in, probe_ack out.
smoke_test() {
    local runtime_flag=("$@")
    "$PY" - "$WORKER_IMAGE" "${runtime_flag[@]}" <<'EOF'
import json, struct, subprocess, sys
image, extra = sys.argv[1], sys.argv[2:]
cmd = ["docker", "run", "--rm", "-i", "--network", "none", "--read-only", "--cap-drop", "ALL",
       "--security-opt", "no-new-privileges", "--user", "65532:65532", "--memory", "256m",
       "--memory-swap", "256m", "--pids-limit", "64", "--ipc", "none",
       "--label", "io.codemode.role=provision-smoke", *extra, image]
body = json.dumps({"k": "probe", "v": 1}).encode()
try:
    p = subprocess.run(cmd, input=struct.pack(">I", len(body)) + body, capture_output=True, timeout=120)
except subprocess.TimeoutExpired:
    sys.exit("smoke test timed out")
out = p.stdout
if len(out) < 4:
    sys.exit(f"no answer from the worker (exit {p.returncode}): {p.stderr.decode(errors='replace')[-2000:]}")
n = struct.unpack(">I", out[:4])[0]
frame = json.loads(out[4:4 + n])
if frame.get("k") != "probe_ack" or frame.get("v") != 1:
    sys.exit(f"unexpected answer: {frame!r}")
print("probe_ack received")
EOF
}

if [ -f "$REPO_ROOT/worker_image/codemode_worker/__main__.py" ]; then
    smoke_test || die "worker smoke test failed under runc"
    log "smoke test passed (runc)"
else
    log "WARNING: worker_image/codemode_worker/__main__.py does not exist yet; smoke test skipped"
fi

# --------------------------------------------------------------------------- 6. gVisor (optional)
gvisor_setup() {
    as_root "gVisor"
    if ! command -v runsc >/dev/null 2>&1; then
        log "installing runsc (gVisor) from Debian"
        apt_install runsc || return 1
    fi
    local runsc_path
    runsc_path="$(command -v runsc)"
    mkdir -p /etc/docker
    # Merge {"runtimes": {"runsc": {"path": ..., "runtimeArgs": ["--network=none"]}}} into daemon.json,
    # keeping everything else. runsc's own --network=none: workers never have a network, and without it
    # this runsc refuses to start ("cannot run with network enabled in root network namespace").
    "$PY" - "$runsc_path" <<'EOF' || return 1
import json, os, sys
path = "/etc/docker/daemon.json"
cfg = {}
if os.path.exists(path):
    with open(path) as f:
        text = f.read().strip()
        cfg = json.loads(text) if text else {}
want = {"path": sys.argv[1], "runtimeArgs": ["--network=none"]}
if cfg.get("runtimes", {}).get("runsc") != want:
    cfg.setdefault("runtimes", {})["runsc"] = want
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print("changed")
EOF
    if ! docker info --format '{{json .Runtimes}}' | grep -q '"runsc"'; then
        # dockerd reloads its runtimes on SIGHUP.
        pkill -HUP -x dockerd || true
        local i
        for ((i = 0; i < 20; i++)); do
            docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"' && break
            sleep 0.5
        done
    fi
    docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' || return 1
    if [ -f "$REPO_ROOT/worker_image/codemode_worker/__main__.py" ]; then
        smoke_test --runtime=runsc || return 1
    else
        timeout 120 docker run --rm --runtime=runsc --network=none --entrypoint /usr/bin/python3 \
            "$WORKER_IMAGE" -I -c 'print("ok")' | grep -q ok || return 1
    fi
}

case "$GVISOR" in
0 | no | false) log "gVisor: skipped (CODEMODE_GVISOR=$GVISOR)" ;;
*)
    if gvisor_setup; then
        log "gVisor: runtime 'runsc' registered and verified (use DockerOptions(oci_runtime=\"runsc\") or --docker-oci-runtime runsc)"
    elif [ "$GVISOR" = "1" ]; then
        die "gVisor was required (CODEMODE_GVISOR=1) but runsc does not work here"
    else
        log "WARNING: gVisor (runsc) does not work on this machine; continuing with runc only"
    fi
    ;;
esac

log "done: $WORKER_IMAGE is ready ($TESTING_IMAGE for the escape tests)"
