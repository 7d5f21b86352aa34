#!/usr/bin/env bash
# A real Kubernetes cluster on this machine, one node or more, offline, loopback only, for the e2e
# tests and benchmarks (see docs/kubernetes.md). Idempotent; run as root.
#
#   bash scripts/provision-kubernetes.sh [up]   build (cached), start, wait until ready, import images
#   bash scripts/provision-kubernetes.sh up --nodes 2   the same, plus node-2 (CODEMODE_K8S_NODES=2)
#   bash scripts/provision-kubernetes.sh up-node 2      add node-2 to the running cluster
#   bash scripts/provision-kubernetes.sh down-node 2    drain and stop node-2, remove every trace of
#                                               it (processes, shims, cgroups, mounts, its
#                                               /etc/hosts line, its node object); node 1 untouched
#   bash scripts/provision-kubernetes.sh kill-node 2    node-2 dies abruptly (SIGKILL to its kubelet,
#                                               containerd, shims and everything in its cgroups; no
#                                               cordon, no API call: its node object and pods stay,
#                                               as after a power loss); up-node 2 brings it back
#   bash scripts/provision-kubernetes.sh down   delete every pod, stop what `up` started (every
#                                               node), unmount, restore the sysctls the kubelet changed
#   bash scripts/provision-kubernetes.sh status one line per component
#   bash scripts/provision-kubernetes.sh build  only build (or find cached) the binaries
#
# What `up` does, each step printed with the seconds elapsed:
#   1. Debian packages: etcd-server, containerd, runc, openssl, gcc (static pause), iproute2.
#   2. kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl built from
#      k8s.io/kubernetes $K8S_VERSION with this machine's Go through the Go module proxy (a throwaway
#      main module requiring k8s.io/kubernetes with `replace` lines pinning the k8s.io/* staging
#      modules at the matching v0.x). Outputs cached in $CACHE_DIR/kubernetes/v$K8S_VERSION/bin: a
#      second run builds nothing. Fallback if this build cannot be made: Debian bookworm's
#      `kubernetes` source package (1.20, GOPATH mode; see docs/kubernetes.md); with 1.20 there is no
#      Pod Security admission and those tests skip.
#   3. A static pause image (a few lines of C) packed as an OCI tarball; a minimal CNI plugin.
#   4. A CA and every certificate and kubeconfig (openssl), once.
#   5. etcd -> kube-apiserver (wait /readyz) -> controller-manager + scheduler -> a SEPARATE
#      containerd (own config, root, state, socket, runc root; never the one dockerd uses) -> kubelet
#      (wait for the node to be Ready and the default service account to exist).
#   6. Import the pause image, the worker image and the service image into that containerd.
#   7. With --nodes N (CODEMODE_K8S_NODES): nodes node-2..node-N, each with its own containerd and
#      kubelet (ports 10250+1000*(i-1) and 10248+1000*(i-1), cgroup root /codemode-node-<i>, pod
#      logs in $LOG_DIR/node-<i>/pods, a loopback /etc/hosts line), the same images imported.
#
# Every process it starts is recorded in $RUN_DIR/<name>.pid; logs go to $LOG_DIR/<name>.log and on a
# failure the tail of the failing component's log is printed.
#
# Environment:
#   CODEMODE_CACHE_DIR        default /var/cache/codemode (built binaries, Go build cache, images)
#   CODEMODE_K8S_VERSION      default 1.34.4 (the release the e2e suite is proven on)
#   CODEMODE_K8S_STATE        default /var/lib/codemode-k8s (etcd data, certs, containerd root)
#   CODEMODE_K8S_LOGS         default /var/log/codemode-k8s
#   CODEMODE_K8S_API_PORT     default 16443 (kube-apiserver on 127.0.0.1)
#   CODEMODE_WORKER_IMAGE     default codemode-worker:1   (from scripts/provision-docker.sh)
#   CODEMODE_TESTING_IMAGE    default codemode-worker-testing:1 (its test twin, imported when docker has it)
#   CODEMODE_SERVICE_IMAGE    default codemode-service:e2e (built here from the top-level Dockerfile)
#   CODEMODE_BASE_IMAGE       default codemode-base:bookworm (the offline base for the service image)
#   CODEMODE_K8S_GVISOR       1: register Debian's runsc as handler "runsc" (experimental, see runsc_runtime;
#                             node 1 only)
#   CODEMODE_K8S_NODES        default 1: how many nodes `up` runs (1..4; `up --nodes N` says the same)
# The admin kubeconfig is $STATE/admin.kubeconfig.
set -euo pipefail

K8S_VERSION="${CODEMODE_K8S_VERSION:-1.34.4}"
CACHE_DIR="${CODEMODE_CACHE_DIR:-/var/cache/codemode}"
STATE="${CODEMODE_K8S_STATE:-/var/lib/codemode-k8s}"
LOG_DIR="${CODEMODE_K8S_LOGS:-/var/log/codemode-k8s}"
API_PORT="${CODEMODE_K8S_API_PORT:-16443}"
WORKER_IMAGE="${CODEMODE_WORKER_IMAGE:-codemode-worker:1}"
TESTING_IMAGE="${CODEMODE_TESTING_IMAGE:-codemode-worker-testing:1}"
SERVICE_IMAGE="${CODEMODE_SERVICE_IMAGE:-codemode-service:e2e}"
BASE_IMAGE="${CODEMODE_BASE_IMAGE:-codemode-base:bookworm}"
NODES="${CODEMODE_K8S_NODES:-1}"
RUN_DIR=/run/codemode-k8s
BIN_DIR="$CACHE_DIR/kubernetes/v$K8S_VERSION/bin"
GOCACHE_DIR="$CACHE_DIR/kubernetes/gocache"
PKI="$STATE/pki"
SOCK="$RUN_DIR/containerd.sock"
PAUSE_IMAGE="localhost/codemode-pause:1"
ETCD_PORT=12379
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)
COMPONENTS=(kubelet containerd kube-scheduler kube-controller-manager kube-apiserver etcd)
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
T0=$(date +%s)

log() { printf '[provision-kubernetes %4ss] %s\n' "$(($(date +%s) - T0))" "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
fail_component() { # name message
    log "ERROR: $1: $2"
    if [ -f "$LOG_DIR/$1.log" ]; then
        log "last 40 lines of $LOG_DIR/$1.log:"
        tail -n 40 "$LOG_DIR/$1.log" >&2
    fi
    exit 1
}
kubectl_() { "$BIN_DIR/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

# ------------------------------------------------------------------------------------ packages
install_packages() {
    local need=()
    command -v etcd >/dev/null || need+=(etcd-server)
    command -v containerd >/dev/null || need+=(containerd)
    command -v runc >/dev/null || need+=(runc)
    command -v openssl >/dev/null || need+=(openssl)
    command -v gcc >/dev/null || need+=(gcc libc6-dev)
    command -v ip >/dev/null || need+=(iproute2)
    command -v nsenter >/dev/null || need+=(util-linux)
    command -v iptables >/dev/null || need+=(iptables)
    [ ${#need[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${need[*]}"
    apt-get update -qq >/dev/null
    # Packages must not start their own daemons (etcd-server and containerd ship services).
    local policy=/usr/sbin/policy-rc.d made=0
    if [ ! -e $policy ]; then
        printf '#!/bin/sh\nexit 101\n' >$policy
        chmod +x $policy
        made=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
        { [ $made = 1 ] && rm -f $policy; die "apt-get install ${need[*]} failed"; }
    [ $made = 1 ] && rm -f $policy
    return 0
}

# ------------------------------------------------------------------------------------ binaries
build_binaries() {
    local bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl) b missing=0
    for b in "${bins[@]}"; do [ -x "$BIN_DIR/$b" ] || missing=1; done
    if [ $missing = 0 ]; then
        log "kubernetes v$K8S_VERSION binaries cached in $BIN_DIR"
        return 0
    fi
    command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || die "Go is needed to build kubernetes (none on PATH)"
    export PATH="$PATH:/usr/local/go/bin"
    local mod="$CACHE_DIR/kubernetes/v$K8S_VERSION/module" staging="v0.${K8S_VERSION#1.}"
    mkdir -p "$mod" "$GOCACHE_DIR" "$LOG_DIR"
    log "building kubernetes v$K8S_VERSION with $(go version | cut -d' ' -f3) (cold: 10-25 min on 2 cores; log $LOG_DIR/build.log)"
    # The throwaway main module: k8s.io/kubernetes's own requirements, plus replace lines pinning
    # its staging modules (which it resolves from ./staging) at the matching published v0.x.
    curl -fsS "${GOPROXY_URL:-https://proxy.golang.org}/k8s.io/kubernetes/@v/v$K8S_VERSION.mod" -o "$mod/upstream.mod" ||
        GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null ||
        die "cannot fetch k8s.io/kubernetes v$K8S_VERSION's go.mod from the Go module proxy"
    python3 - "$mod/upstream.mod" "$mod/go.mod" "$K8S_VERSION" "$staging" <<'EOF'
import re, sys
src = open(sys.argv[1]).read()
version, staging = sys.argv[3], sys.argv[4]
body = src[src.index("\ngo "):src.index("\nreplace (")]
body = re.sub(r"\ngodebug[^\n]*", "", body)
mods = re.findall(r"\t(k8s\.io/[a-z0-9-]+) => \./staging", src)
out = "module codemode.local/kubebuild\n" + body + f"\nrequire k8s.io/kubernetes v{version}\n\nreplace (\n"
out += "".join(f"\t{m} => {m} {staging}\n" for m in mods) + ")\n"
open(sys.argv[2], "w").write(out)
EOF
    local ld="-s -w"
    local pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
        ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    rm -rf "$BIN_DIR.tmp"
    mkdir -p "$BIN_DIR.tmp"
    local targets=()
    for b in "${bins[@]}"; do targets+=("k8s.io/kubernetes/cmd/$b"); done
    if ! (cd "$mod" && GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOCACHE="$GOCACHE_DIR" \
        go build -p 2 -trimpath -ldflags "$ld" -o "$BIN_DIR.tmp/" "${targets[@]}") >"$LOG_DIR/build.log" 2>&1; then
        tail -n 40 "$LOG_DIR/build.log" >&2
        die "building kubernetes v$K8S_VERSION failed (log: $LOG_DIR/build.log). Fallback: Debian bookworm's kubernetes source package (1.20), see docs/kubernetes.md"
    fi
    rm -rf "$BIN_DIR"
    mv "$BIN_DIR.tmp" "$BIN_DIR"
    log "built: $("$BIN_DIR/kubelet" --version)"
}

# ------------------------------------------------------------------------------------ pause + CNI
make_pause_image() {
    local out="$CACHE_DIR/kubernetes/pause-oci.tar"
    [ -s "$out" ] && return 0
    log "building the static pause image"
    local work
    work="$(mktemp -d)"
    cat >"$work/pause.c" <<'EOF'
/* A pod's sandbox process: sleep until told to stop, reap nothing else. */
#include <signal.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;) pause();
}
EOF
    gcc -static -O2 -o "$work/pause" "$work/pause.c" || die "gcc -static pause.c failed (libc6-dev installed?)"
    python3 - "$work/pause" "$out" "$PAUSE_IMAGE" <<'EOF'
import hashlib, io, json, sys, tarfile
binary, out, name = sys.argv[1:4]
def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest(), data
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
    info = t.gettarinfo(binary, "pause"); info.uid = info.gid = 0; info.uname = info.gname = ""
    info.mode = 0o755; info.mtime = 0
    with open(binary, "rb") as f:
        t.addfile(info, f)
layer_d, layer_b = blob(layer.getvalue())
config = {"architecture": "amd64", "os": "linux",
          "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
          "rootfs": {"type": "layers", "diff_ids": [layer_d]}}
config_d, config_b = blob(json.dumps(config).encode())
manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_d, "size": len(config_b)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_d, "size": len(layer_b)}]}
manifest_d, manifest_b = blob(json.dumps(manifest).encode())
index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": manifest_d, "size": len(manifest_b),
         "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}
with tarfile.open(out, "w") as t:
    def add(path, data):
        info = tarfile.TarInfo(path); info.size = len(data); info.mtime = 0
        t.addfile(info, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add("index.json", json.dumps(index).encode())
    for d, b in ((layer_d, layer_b), (config_d, config_b), (manifest_d, manifest_b)):
        add("blobs/sha256/" + d.split(":")[1], b)
EOF
    rm -rf "$work"
}

write_cni() {
    # A minimal CNI plugin (this project's own). Every pod gets eth0, one end of a veth pair, with a
    # link-local /32 address. For worker pods both ends stay inside the pod's network namespace: no
    # packet can leave the pod (this stands in for the deny-all NetworkPolicy, which needs a CNI that
    # enforces policies). Pods of the host service's namespace (codemode) get the other end in the
    # host, a route to it, and a DNAT of the kubernetes Service address to the loopback API server:
    # the service can reach the API server and nothing else. `lo` is brought up for port-forward.
    mkdir -p "$STATE/cni/bin" "$STATE/cni/net.d"
    cat >"$STATE/cni/bin/codemode-cni" <<'EOF'
#!/bin/bash
set -eu
cfg="$(cat)"
ver="$(printf '%s' "$cfg" | sed -n 's/.*"cniVersion" *: *"\([^"]*\)".*/\1/p')"
ver="${ver:-0.4.0}"
case "${CNI_COMMAND:-}" in
VERSION) echo '{"cniVersion":"0.4.0","supportedVersions":["0.3.0","0.3.1","0.4.0"]}'; exit 0 ;;
DEL|CHECK) exit 0 ;;
ADD) ;;
*) echo '{"code":4,"msg":"unknown CNI_COMMAND"}'; exit 1 ;;
esac
ns() { nsenter --net="$CNI_NETNS" "$@"; }
if [ "$CNI_IFNAME" = lo ]; then
    ns ip link set lo up
    echo "{\"cniVersion\":\"$ver\",\"interfaces\":[{\"name\":\"lo\",\"sandbox\":\"$CNI_NETNS\"}],\"ips\":[{\"version\":\"4\",\"address\":\"127.0.0.1/8\",\"interface\":0}]}"
    exit 0
fi
h="$(printf '%s' "$CNI_CONTAINERID" | sha256sum)"
a=$((16#${h:0:2} % 250 + 2)); b=$((16#${h:2:2} % 250 + 2))
podns="$(printf '%s' "${CNI_ARGS:-}" | tr ';' '\n' | sed -n 's/^K8S_POD_NAMESPACE=//p')"
if [ "$podns" = "${CODEMODE_SERVICE_NS:-codemode}" ]; then
    addr="10.244.$a.$b"; host="cm${h:0:11}"
    ip link add "$host" type veth peer name eth0 netns "$CNI_NETNS"
    ip link set "$host" up
    ip addr add 10.244.0.1/32 dev "$host"
    ip route add "$addr/32" dev "$host"
    sysctl -qw "net.ipv4.conf.$host.route_localnet=1"
    ns ip addr add "$addr/32" dev eth0
    ns ip link set eth0 up
    ns ip route add 10.244.0.1/32 dev eth0
    ns ip route add default via 10.244.0.1 dev eth0
else
    addr="169.254.$a.$b"
    ns ip link add eth0 type veth peer name veth-peer
    ns ip addr add "$addr/32" dev eth0
    ns ip link set eth0 up
    ns ip link set veth-peer up
fi
echo "{\"cniVersion\":\"$ver\",\"interfaces\":[{\"name\":\"eth0\",\"sandbox\":\"$CNI_NETNS\"}],\"ips\":[{\"version\":\"4\",\"address\":\"$addr/32\",\"interface\":0}]}"
EOF
    chmod 755 "$STATE/cni/bin/codemode-cni"
    ln -sf codemode-cni "$STATE/cni/bin/loopback"
    cat >"$STATE/cni/net.d/10-codemode.conf" <<'EOF'
{"cniVersion": "0.4.0", "name": "codemode", "type": "codemode-cni"}
EOF
}

# ------------------------------------------------------------------------------------ PKI
make_cert() { # name CN O [SANs]
    local name=$1 cn=$2 org=$3 san=${4:-}
    [ -s "$PKI/$name.crt" ] && return 0
    local subj="/CN=$cn"
    [ -n "$org" ] && subj="/O=$org$subj"
    openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
    openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=serverAuth,clientAuth"
        [ -n "$san" ] && echo "subjectAltName=$san"
    } >"$PKI/$name.ext"
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
        -days 3650 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
    rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

make_kubeconfig() { # name cert-name
    local file="$STATE/$1.kubeconfig"
    [ -s "$file" ] && return 0
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: codemode-local
    cluster:
      server: https://127.0.0.1:$API_PORT
      certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
  - name: $1
    user:
      client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
      client-key-data: $(base64 -w0 "$PKI/$2.key")
contexts:
  - name: codemode-local
    context: {cluster: codemode-local, user: $1}
current-context: codemode-local
EOF
    chmod 600 "$file"
}

make_pki() {
    mkdir -p "$PKI"
    chmod 700 "$PKI"
    if [ ! -s "$PKI/ca.crt" ]; then
        log "creating the cluster CA and certificates in $PKI"
        openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
        openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=codemode-local-ca" -days 3650 -sha256 \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -out "$PKI/ca.crt" 2>/dev/null
    fi
    make_cert apiserver kube-apiserver "" \
        "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    make_cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
    make_cert admin codemode-admin system:masters
    make_cert controller-manager system:kube-controller-manager ""
    make_cert scheduler system:kube-scheduler ""
    make_cert kubelet-client system:node:localhost system:nodes
    make_cert kubelet-serving localhost "" "IP:127.0.0.1,DNS:localhost"
    if [ ! -s "$PKI/sa.key" ]; then
        openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
        openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    fi
    make_kubeconfig admin admin
    make_kubeconfig controller-manager controller-manager
    make_kubeconfig scheduler scheduler
    make_kubeconfig kubelet kubelet-client
}

# ------------------------------------------------------------------------------------ processes
running() { [ -f "$RUN_DIR/$1.pid" ] && kill -0 "$(cat "$RUN_DIR/$1.pid")" 2>/dev/null; }

start() { # name [env...] -- command...
    local name=$1
    shift
    if running "$name"; then
        log "$name already running (pid $(cat "$RUN_DIR/$name.pid"))"
        return 0
    fi
    local envs=()
    while [ "$1" != -- ]; do
        envs+=("$1")
        shift
    done
    shift
    echo "--- start $(date -u +%FT%TZ)" >>"$LOG_DIR/$name.log"
    env "${envs[@]}" setsid "$@" >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
    echo $! >"$RUN_DIR/$name.pid"
    log "started $name (pid $!, log $LOG_DIR/$name.log)"
}

wait_for() { # name seconds description command...
    local name=$1 secs=$2 what=$3
    shift 3
    local end=$(($(date +%s) + secs))
    until "$@" >/dev/null 2>&1; do
        running "$name" || fail_component "$name" "exited while waiting for $what"
        [ "$(date +%s)" -lt $end ] || fail_component "$name" "$what not reached within ${secs}s"
        sleep 0.5
    done
    log "$name: $what"
}

api_ready() { curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:$API_PORT/readyz" >/dev/null; }

containerd_config() { # root-dir state-dir socket runc-root with-runsc(0|1) [extra CRI line]
    # One node's containerd: root (with opt/ beside it), state, socket and runc root all its own.
    local runsc="" extra=""
    [ "$5" = 1 ] && runsc="$(runsc_runtime)"
    [ -n "${6:-}" ] && extra=$'\n'"  $6"
    cat <<EOF
version = 2
root = "$1"
state = "$2"
[grpc]
  address = "$3"
[ttrpc]
  address = "$3.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$(dirname "$1")/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Root here lacks CAP_SYS_RESOURCE: runc must not lower oom_score_adj below its own.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true$extra
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
        Root = "$4"
$runsc
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$STATE/cni/bin"
    conf_dir = "$STATE/cni/net.d"
EOF
}

kubelet_config() { # port healthz-port socket serving-cert-name
    cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $2
containerRuntimeEndpoint: unix://$3
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
podPidsLimit: 4096
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
tlsCertFile: $PKI/$4.crt
tlsPrivateKeyFile: $PKI/$4.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
evictionHard:
  memory.available: 100Mi
  nodefs.available: 2%
  imagefs.available: 2%
EOF
}

write_configs() {
    mkdir -p "$STATE/containerd" "$STATE/kubelet"
    containerd_config "$STATE/containerd/root" "$RUN_DIR/containerd" "$SOCK" "$RUN_DIR/runc" 1 \
        >"$STATE/containerd/config.toml"
    kubelet_config 10250 10248 "$SOCK" kubelet-serving >"$STATE/kubelet/config.yaml"
}

gvisor_enabled() { [ "${CODEMODE_K8S_GVISOR:-0}" = 1 ] && command -v runsc >/dev/null; }

runsc_runtime() {
    # Opt-in (CODEMODE_K8S_GVISOR=1): gVisor (Debian's runsc) as the CRI handler "runsc" for
    # RuntimeClass gvisor (k8s/overlays/gvisor), through the runc shim (Debian ships no
    # containerd-shim-runsc-v1) with a wrapper adding --network=none. Measured here with runsc
    # 20221219: the pod starts, but the attached worker's stdout ends during the probe; unproven.
    gvisor_enabled || return 0
    cat >"$STATE/runsc-no-network" <<EOF2
#!/bin/sh
exec $(command -v runsc) --network=none "\$@"
EOF2
    chmod 755 "$STATE/runsc-no-network"
    cat <<EOF2
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        BinaryName = "$STATE/runsc-no-network"
        Root = "$RUN_DIR/runsc"
EOF2
}

save_sysctls() {
    [ -f "$STATE/sysctls.saved" ] && return 0
    local s
    for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s")"; done >"$STATE/sysctls.saved"
}

start_cluster() {
    mkdir -p "$RUN_DIR" "$LOG_DIR" "$STATE/etcd"
    write_configs
    start etcd -- etcd --name codemode --data-dir "$STATE/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
        --initial-cluster codemode=http://127.0.0.1:12380
    wait_for etcd 60 "healthy" curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
    start kube-apiserver -- "$BIN_DIR/kube-apiserver" \
        --bind-address=127.0.0.1 --secure-port="$API_PORT" --advertise-address=127.0.0.1 \
        --etcd-servers="http://127.0.0.1:$ETCD_PORT" --endpoint-reconciler-type=none \
        --service-cluster-ip-range=10.96.0.0/24 \
        --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
        --client-ca-file="$PKI/ca.crt" \
        --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=Hostname \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
        --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
        --allow-privileged=false --profiling=false
    wait_for kube-apiserver 120 "/readyz ok" api_ready
    # Only now: the controller-manager dies on RBAC bootstrap against a half-ready API server.
    start kube-controller-manager -- "$BIN_DIR/kube-controller-manager" \
        --kubeconfig="$STATE/controller-manager.kubeconfig" --bind-address=127.0.0.1 --leader-elect=false \
        --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
        --use-service-account-credentials=true --controllers='*,-nodeipam,-cloud-node-lifecycle' --profiling=false
    start kube-scheduler -- "$BIN_DIR/kube-scheduler" \
        --kubeconfig="$STATE/scheduler.kubeconfig" --bind-address=127.0.0.1 --leader-elect=false --profiling=false
    start containerd -- containerd --config "$STATE/containerd/config.toml"
    wait_for containerd 60 "socket up" ctr --address "$SOCK" version
    import_images
    save_sysctls
    # A node object left by an earlier run may still say Ready: make the kubelet register afresh.
    if ! running kubelet; then
        kubectl_ delete node localhost --ignore-not-found --wait=true >/dev/null 2>&1 || true
    fi
    # The in-tree credential provider otherwise probes the cloud metadata address (not loopback).
    start kubelet AWS_EC2_METADATA_DISABLED=true -- "$BIN_DIR/kubelet" \
        --config="$STATE/kubelet/config.yaml" --kubeconfig="$STATE/kubelet.kubeconfig" \
        --hostname-override=localhost --root-dir="$STATE/kubelet/root" --cert-dir="$STATE/kubelet/pki"
    wait_for kubelet 120 "node Ready" bash -c \
        "'$BIN_DIR/kubectl' --kubeconfig '$STATE/admin.kubeconfig' get node localhost -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
    wait_for kube-controller-manager 60 "default service account exists" kubectl_ get serviceaccount default -n default
    if gvisor_enabled; then
        kubectl_ label node localhost codemode.io/gvisor=true --overwrite >/dev/null
        log "gVisor: runsc registered as handler runsc; node labelled codemode.io/gvisor=true"
    fi
}

# ------------------------------------------------------------------------------------ images
build_service_image() {
    docker info >/dev/null 2>&1 || die "docker is not running: run scripts/provision-docker.sh first"
    docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || die "base image $BASE_IMAGE missing: run scripts/provision-docker.sh first"
    log "building the service image $SERVICE_IMAGE from the Dockerfile (offline, base $BASE_IMAGE)"
    local wheels="$CACHE_DIR/service-wheels"
    # The base has python3 but no venv/pip: the build installs from a local wheel directory
    # (fetched here, cp311, binary only) with a pip wheel, fully offline inside the build.
    if [ ! -f "$wheels/.complete" ] || [ "$REPO/pyproject.toml" -nt "$wheels/.complete" ]; then
        rm -rf "$wheels"
        mkdir -p "$wheels"
        local py=python3
        [ -x "$REPO/.venv/bin/python" ] && py="$REPO/.venv/bin/python"
        "$py" -m pip download -q --dest "$wheels" --only-binary=:all: --python-version 3.11 \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 --platform any \
            pip setuptools wheel "$REPO[kubernetes,tracing]" >"$LOG_DIR/service-wheels.log" 2>&1 ||
            { tail -20 "$LOG_DIR/service-wheels.log" >&2; die "downloading the service's wheels failed"; }
        rm -f "$wheels"/codemode-*.whl
        touch "$wheels/.complete"
    fi
    rm -rf "$REPO/.build-wheels"
    cp -a "$wheels" "$REPO/.build-wheels"
    docker build -q --network=none --build-arg BASE_IMAGE="$BASE_IMAGE" \
        --build-arg WHEELS=.build-wheels -t "$SERVICE_IMAGE" "$REPO" >"$LOG_DIR/service-image.log" 2>&1 ||
        { rm -rf "$REPO/.build-wheels"; tail -30 "$LOG_DIR/service-image.log" >&2; die "docker build of $SERVICE_IMAGE failed"; }
    rm -rf "$REPO/.build-wheels"
}

import_docker_image() { # image [socket marker-dir what]: into node 1's containerd by default
    local sock="${2:-$SOCK}" dir="${3:-$STATE}" what="${4:-}" id want
    # (the default apart: a quote inside "${...:-...}" would open a string for bash)
    [ -n "$what" ] || what="the cluster's containerd"
    id="$(docker image inspect -f '{{.Id}}' "$1")" || die "image $1 not in docker"
    want="$dir/imported-$(echo "$1" | tr '/:' '__')"
    if [ "$(cat "$want" 2>/dev/null)" = "$id" ] && ctr --address "$sock" -n k8s.io images ls -q | grep -q "$1"; then
        return 0
    fi
    log "importing $1 into $what"
    docker save "$1" | ctr --address "$sock" -n k8s.io images import --no-unpack - >/dev/null ||
        die "importing $1 into $what failed"
    echo "$id" >"$want"
}

import_pause_image() { # socket
    ctr --address "$1" -n k8s.io images ls -q | grep -qx "$PAUSE_IMAGE" ||
        ctr --address "$1" -n k8s.io images import "$CACHE_DIR/kubernetes/pause-oci.tar" >/dev/null ||
        die "importing the pause image failed"
}

import_images() {
    import_pause_image "$SOCK"
    docker image inspect "$WORKER_IMAGE" >/dev/null 2>&1 || die "worker image $WORKER_IMAGE missing: run scripts/provision-docker.sh first"
    import_docker_image "$WORKER_IMAGE"
    # The test twin (arbitrary Python; KubernetesOptions(testing_entry=True)) for the containment
    # tests and the transport benchmarks; never used by the service.
    if docker image inspect "$TESTING_IMAGE" >/dev/null 2>&1; then
        import_docker_image "$TESTING_IMAGE"
    else
        log "test image $TESTING_IMAGE not in docker: the tests that need it will say so"
    fi
    build_service_image
    local before
    before="$(cat "$STATE/imported-$(echo "$SERVICE_IMAGE" | tr '/:' '__')" 2>/dev/null || true)"
    import_docker_image "$SERVICE_IMAGE"
    # A new service image under the same tag: restart a Deployment already running the old one.
    if [ -n "$before" ] && [ "$before" != "$(cat "$STATE/imported-$(echo "$SERVICE_IMAGE" | tr '/:' '__')")" ] &&
        kubectl_ get deployment codemode -n codemode >/dev/null 2>&1; then
        kubectl_ rollout restart deployment/codemode -n codemode >/dev/null && log "restarted deployment/codemode on the new service image"
    fi
}

# ------------------------------------------------------------------------------------ more nodes
# Node 2 (and up to MAX_NODE) beside node 1 (`localhost`) on this machine: its own containerd (own
# socket, root, state and runc root) and its own kubelet (its own ports, root dir, certificates,
# cgroup root and pod log directory), registered as node-<i>. What must not be shared (each of these
# breaks a node or harms the other when shared): the cgroup root (each kubelet removes the pods it
# finds under its root that it does not know of), the pod log directory (each kubelet deletes the
# log directories of pods it does not know of), and the node's name must resolve, to loopback, for
# the API server, which dials kubelets by name (--kubelet-preferred-address-types=Hostname): an
# /etc/hosts line, removed again by down-node. The CNI is node 1's (its plugin keeps no state).
MAX_NODE=4

node_vars() { # i: sets N_NAME N_RUN N_STATE N_LOGS N_SOCK N_PORT N_HEALTHZ N_CGROUP N_HOSTS
    [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -ge 2 ] && [ "$1" -le $MAX_NODE ] ||
        die "node number must be 2..$MAX_NODE (node 1 is the cluster's own: up/down), not '$1'"
    N_NAME="node-$1"
    N_RUN="$RUN_DIR/$N_NAME"
    N_STATE="$STATE/$N_NAME"
    N_LOGS="$LOG_DIR/$N_NAME"
    N_SOCK="$N_RUN/containerd.sock"
    N_PORT=$((10250 + 1000 * ($1 - 1)))
    N_HEALTHZ=$((10248 + 1000 * ($1 - 1)))
    N_CGROUP="codemode-$N_NAME"
    N_HOSTS="127.0.0.1 $N_NAME # codemode-k8s: $N_NAME's kubelet (scripts/provision-kubernetes.sh down-node ${1})"
}

cgroup_hierarchies() { # every mounted cgroup hierarchy (v1 controllers, name=systemd, unified)
    awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/mounts
}

node_cgroups_create() {
    local h
    for h in $(cgroup_hierarchies); do
        mkdir -p "$h/$N_CGROUP"
        # A new v1 cpuset has no CPUs and no memory nodes: nothing could join it.
        if [ -f "$h/cpuset.cpus" ]; then
            [ -n "$(cat "$h/$N_CGROUP/cpuset.cpus")" ] || cat "$h/cpuset.cpus" >"$h/$N_CGROUP/cpuset.cpus"
            [ -n "$(cat "$h/$N_CGROUP/cpuset.mems")" ] || cat "$h/cpuset.mems" >"$h/$N_CGROUP/cpuset.mems"
        fi
    done
}

node_cgroup_procs() { # the pids in the node's cgroups, in any hierarchy
    local h
    for h in $(cgroup_hierarchies); do
        [ ! -d "$h/$N_CGROUP" ] || find "$h/$N_CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null || true
    done | sort -u
}

node_cgroups_remove() {
    # Killing a node's kubelet and containerd does not stop its containers: whatever still runs
    # in its cgroups is killed, then every cgroup the kubelet made is removed, deepest first.
    local i pid h
    for i in $(seq 1 20); do
        [ -z "$(node_cgroup_procs)" ] && break
        for pid in $(node_cgroup_procs); do kill -KILL "$pid" 2>/dev/null || true; done
        sleep 0.25
    done
    [ -z "$(node_cgroup_procs)" ] || log "WARNING: processes left in $N_NAME's cgroups: $(node_cgroup_procs | tr '\n' ' ')"
    for h in $(cgroup_hierarchies); do
        [ ! -d "$h/$N_CGROUP" ] || find "$h/$N_CGROUP" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        [ ! -d "$h/$N_CGROUP" ] || log "WARNING: could not remove $h/$N_CGROUP"
    done
    return 0
}

hosts_write() { # content: in place (in a container /etc/hosts is a bind mount: no rename)
    printf '%s' "$1" >/etc/hosts
}

node_hosts_add() {
    grep -qxF "$N_HOSTS" /etc/hosts && return 0
    local have
    have="$(getent hosts "$N_NAME" | awk '{print $1}' | head -n1 || true)"
    if [ -n "$have" ]; then
        [ "$have" = 127.0.0.1 ] || die "$N_NAME resolves to $have, not loopback: the API server could not reach its kubelet"
        return 0
    fi
    [ -z "$(tail -c1 /etc/hosts)" ] || echo >>/etc/hosts
    echo "$N_HOSTS" >>/etc/hosts
    log "added '127.0.0.1 $N_NAME' to /etc/hosts (the API server dials kubelets by name)"
}

node_hosts_remove() {
    grep -qxF "$N_HOSTS" /etc/hosts || return 0
    hosts_write "$(grep -vxF "$N_HOSTS" /etc/hosts || true)"$'\n'
    log "removed $N_NAME from /etc/hosts"
}

node_pki() {
    make_cert "kubelet-client-$N_NAME" "system:node:$N_NAME" system:nodes
    make_cert "kubelet-serving-$N_NAME" "$N_NAME" "" "IP:127.0.0.1,DNS:$N_NAME"
    make_kubeconfig "$N_NAME/kubelet" "kubelet-client-$N_NAME"
}

node_write_configs() {
    mkdir -p "$N_STATE/containerd" "$N_STATE/kubelet"
    # netns_mounts_under_state_dir: its pods' network namespaces under its own state directory
    # (not the shared /run/netns), where down-node finds whatever a killed containerd left.
    containerd_config "$N_STATE/containerd/root" "$N_RUN/containerd" "$N_SOCK" "$N_RUN/runc" 0 \
        "netns_mounts_under_state_dir = true" >"$N_STATE/containerd/config.toml"
    {
        kubelet_config "$N_PORT" "$N_HEALTHZ" "$N_SOCK" "kubelet-serving-$N_NAME"
        echo "cgroupRoot: /$N_CGROUP"
        echo "podLogsDir: $N_LOGS/pods"
    } >"$N_STATE/kubelet/config.yaml"
}

node_running() { running "$N_NAME/kubelet" || running "$N_NAME/containerd"; }

node_clean_stale() { # leftovers of a node whose processes were killed without down-node
    node_running && return 0
    kill_shims "$N_SOCK" "$N_RUN/runc"
    unmount_under "$N_STATE" "$N_RUN"
    return 0
}

node_ready() {
    kubectl_ get node "$N_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

up_node() { # i
    node_vars "$1"
    running kube-apiserver || die "the cluster is not running: bash $0 up first (node 1)"
    docker image inspect "$WORKER_IMAGE" >/dev/null 2>&1 || die "worker image $WORKER_IMAGE missing: run scripts/provision-docker.sh first"
    mkdir -p "$N_RUN" "$N_LOGS/pods" "$N_STATE"
    node_clean_stale
    node_pki
    node_write_configs
    node_cgroups_create
    node_hosts_add
    start "$N_NAME/containerd" -- containerd --config "$N_STATE/containerd/config.toml"
    wait_for "$N_NAME/containerd" 60 "socket up" ctr --address "$N_SOCK" version
    # The images of node 1, from docker (never rebuilt here: the service image is node 1's build).
    import_pause_image "$N_SOCK"
    local image
    for image in "$WORKER_IMAGE" "$TESTING_IMAGE" "$SERVICE_IMAGE"; do
        if docker image inspect "$image" >/dev/null 2>&1; then
            import_docker_image "$image" "$N_SOCK" "$N_STATE" "$N_NAME's containerd"
        else
            log "$image not in docker: not on $N_NAME"
        fi
    done
    if [ -f "$N_RUN/killed" ]; then
        # Back from kill-node: the node returns under its old node object, as a real one would (its
        # kubelet removes the containers of pods the API no longer has).
        rm -f "$N_RUN/killed"
    elif ! running "$N_NAME/kubelet"; then
        kubectl_ delete node "$N_NAME" --ignore-not-found --wait=true >/dev/null 2>&1 || true
    fi
    local t0
    t0=$(date +%s%N)
    start "$N_NAME/kubelet" AWS_EC2_METADATA_DISABLED=true -- "$BIN_DIR/kubelet" \
        --config="$N_STATE/kubelet/config.yaml" --kubeconfig="$N_STATE/kubelet.kubeconfig" \
        --hostname-override="$N_NAME" --root-dir="$N_STATE/kubelet/root" --cert-dir="$N_STATE/kubelet/pki"
    wait_for "$N_NAME/kubelet" 120 "node Ready" node_ready
    log "$N_NAME Ready $((($(date +%s%N) - t0) / 1000000)) ms after its kubelet started (kubelet port $N_PORT, cgroup root /$N_CGROUP)"
}

down_node() { # i: stop node i and remove every trace of it but its state directory
    node_vars "$1"
    if running kube-apiserver && kubectl_ get node "$N_NAME" >/dev/null 2>&1; then
        # Cordoned first: a controller's replacement pods go to the other nodes, not back here.
        kubectl_ cordon "$N_NAME" >/dev/null 2>&1 || true
        if running "$N_NAME/kubelet"; then
            log "deleting the pods on $N_NAME"
            kubectl_ delete pods --all-namespaces --field-selector "spec.nodeName=$N_NAME" \
                --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
            local i
            for i in $(seq 1 60); do
                [ -z "$(ctr --address "$N_SOCK" -n k8s.io tasks ls -q 2>/dev/null)" ] && break
                sleep 0.5
            done
        fi
    fi
    stop_pid "$N_NAME/kubelet"
    stop_pid "$N_NAME/containerd"
    kill_shims "$N_SOCK" "$N_RUN/runc"
    node_cgroups_remove
    unmount_under "$N_STATE" "$N_RUN"
    if running kube-apiserver; then
        kubectl_ delete pods --all-namespaces --field-selector "spec.nodeName=$N_NAME" \
            --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
        kubectl_ delete node "$N_NAME" --ignore-not-found --wait=true >/dev/null 2>&1 &&
            log "deleted node $N_NAME"
    fi
    node_hosts_remove
    # The kubelet's links to its containers' logs (/var/log/containers is every kubelet's).
    find /var/log/containers -maxdepth 1 -type l -lname "$N_LOGS/pods/*" -delete 2>/dev/null || true
    rm -rf "$N_RUN"
    log "$N_NAME stopped (state kept in $N_STATE; logs in $N_LOGS)"
}

kill_node() { # i: node i dies abruptly, as in a power loss: everything of it SIGKILLed at once
    node_vars "$1"
    [ -d "$N_RUN" ] || die "$N_NAME is not up (up-node $1 first)"
    touch "$N_RUN/killed"
    local name shim i pid
    for name in kubelet containerd; do
        [ ! -f "$N_RUN/$name.pid" ] || kill -KILL "$(cat "$N_RUN/$name.pid")" 2>/dev/null || true
    done
    # Its containers outlive its kubelet and containerd (a looping worker kept a core busy): their
    # shims and every process in the node's cgroups die too. No cordon, no pod deletion, no node
    # object deletion: the API server learns of it only from the missing heartbeats.
    for shim in $(pgrep -f "containerd-shim-runc-v2 .*-address $N_SOCK( |\$)" || true); do
        kill -KILL "$shim" 2>/dev/null || true
    done
    for i in $(seq 1 40); do
        [ -z "$(node_cgroup_procs)" ] && break
        for pid in $(node_cgroup_procs); do kill -KILL "$pid" 2>/dev/null || true; done
        sleep 0.05
    done
    rm -f "$N_RUN/kubelet.pid" "$N_RUN/containerd.pid"
    [ -z "$(node_cgroup_procs)" ] || log "WARNING: processes left in $N_NAME's cgroups: $(node_cgroup_procs | tr '\n' ' ')"
    log "$N_NAME killed (kubelet, containerd, shims, containers); its node object stays: up-node $1 brings it back"
}

extra_nodes() { # the numbers of the nodes up_node started (their run directories exist)
    local d
    for d in "$RUN_DIR"/node-*; do
        [ -d "$d" ] && echo "${d##*/node-}"
    done
    return 0
}

# ------------------------------------------------------------------------------------ teardown
stop_pid() { # name
    local name=$1 pid i
    [ -f "$RUN_DIR/$name.pid" ] || return 0
    pid="$(cat "$RUN_DIR/$name.pid")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
        log "stopped $name (pid $pid)"
    fi
    rm -f "$RUN_DIR/$name.pid"
}

kill_shims() { # socket runc-root: a containerd's shims (each outlives its containerd) and containers
    local shim c
    for shim in $(pgrep -f "containerd-shim-runc-v2 .*-address $1( |\$)" || true); do
        kill -KILL "$shim" 2>/dev/null || true
    done
    [ -d "$2" ] && for c in $(runc --root "$2" list -q 2>/dev/null); do
        runc --root "$2" delete -f "$c" >/dev/null 2>&1 || true
    done
    return 0
}

unmount_under() { # dir...: every mount under them, deepest first
    local IFS='|'
    { awk '{print $2}' /proc/mounts | grep -E "^($*)/" || true; } | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
}

down() {
    # The other nodes first (each drained, stopped and removed), then node 1 and the control plane.
    local n
    for n in $(extra_nodes); do down_node "$n"; done
    # No controller may recreate what is deleted: stop them first.
    stop_pid kube-controller-manager
    stop_pid kube-scheduler
    if running kube-apiserver && running kubelet; then
        log "deleting every pod"
        kubectl_ delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
        local i
        for i in $(seq 1 60); do
            # Deleted from the API at once (force); wait until the kubelet has stopped the containers.
            [ -z "$(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    local c
    for c in "${COMPONENTS[@]}"; do
        stop_pid "$c"
    done
    kill_shims "$SOCK" "$RUN_DIR/runc"
    unmount_under "$STATE" "$RUN_DIR"
    ip -o link show | sed -n 's/^[0-9]*: \(cm[0-9a-f]*\)@.*/\1/p' | while read -r l; do ip link del "$l" 2>/dev/null || true; done
    if [ -f "$STATE/sysctls.saved" ]; then
        while IFS= read -r kv; do sysctl -qw "$kv" || true; done <"$STATE/sysctls.saved"
        rm -f "$STATE/sysctls.saved"
        log "restored sysctls: ${SYSCTLS[*]}"
    fi
    nat_rules delete
    log "cluster stopped (state kept in $STATE; logs in $LOG_DIR)"
}

nat_rules() { # add|delete: the kubernetes Service address -> the loopback API server, for codemode pods
    local op=-A
    [ "$1" = delete ] && op=-D
    local rule=(PREROUTING -i 'cm+' -d 10.96.0.1 -p tcp --dport 443 -j DNAT --to-destination "127.0.0.1:$API_PORT")
    if [ "$1" = add ]; then
        iptables -t nat -C "${rule[@]}" 2>/dev/null && return 0
    fi
    iptables -t nat "$op" "${rule[@]}" 2>/dev/null || true
}

status() {
    local c
    for c in "${COMPONENTS[@]}"; do
        if running "$c"; then echo "$c running (pid $(cat "$RUN_DIR/$c.pid"))"; else echo "$c stopped"; fi
    done
    local n
    for n in $(extra_nodes); do
        for c in kubelet containerd; do
            if running "node-$n/$c"; then
                echo "node-$n/$c running (pid $(cat "$RUN_DIR/node-$n/$c.pid"))"
            else
                echo "node-$n/$c stopped"
            fi
        done
    done
    echo "kubeconfig: $STATE/admin.kubeconfig  logs: $LOG_DIR  binaries: $BIN_DIR"
}

clean_stale() {
    # Leftovers of a cluster whose processes were killed without `down` (e.g. the machine's
    # session ended): shims and mounts of our containerd. Only when none of ours runs.
    local c
    for c in "${COMPONENTS[@]}"; do running "$c" && return 0; done
    kill_shims "$SOCK" "$RUN_DIR/runc"
    unmount_under "$STATE" "$RUN_DIR"
    return 0
}

up() {
    [ "$(id -u)" = 0 ] || die "run as root"
    mkdir -p "$LOG_DIR" "$RUN_DIR" "$STATE"
    clean_stale
    install_packages
    log "packages ok"
    build_binaries
    make_pause_image
    write_cni
    make_pki
    nat_rules add
    start_cluster
    local n
    for n in $(seq 2 "$NODES"); do up_node "$n"; done
    log "cluster ready ($NODES node(s)): KUBECONFIG=$STATE/admin.kubeconfig $BIN_DIR/kubectl get nodes"
}

# Sourced with CODEMODE_K8S_SOURCE_ONLY=1: define the functions only (for debugging).
[ "${CODEMODE_K8S_SOURCE_ONLY:-}" = 1 ] && return 0

command="${1:-up}"
[ $# -gt 0 ] && shift
if [ "$command" = up ] && [ "${1:-}" = --nodes ]; then
    NODES="${2:-}"
    shift 2 || true
fi
[[ "$NODES" =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le $MAX_NODE ] ||
    die "--nodes / CODEMODE_K8S_NODES must be 1..$MAX_NODE, not '$NODES'"

case "$command" in
up) up ;;
down) down ;;
up-node)
    [ "$(id -u)" = 0 ] || die "run as root"
    up_node "${1:-2}"
    ;;
down-node)
    [ "$(id -u)" = 0 ] || die "run as root"
    down_node "${1:-2}"
    ;;
kill-node)
    [ "$(id -u)" = 0 ] || die "run as root"
    kill_node "${1:-2}"
    ;;
status) status ;;
build)
    install_packages
    build_binaries
    ;;
prepare) # everything but the build and the processes (for debugging the script)
    mkdir -p "$LOG_DIR" "$RUN_DIR" "$STATE"
    install_packages
    make_pause_image
    write_cni
    make_pki
    ;;
*) die "usage: $0 [up [--nodes N]|down|up-node N|down-node N|kill-node N|status|build]" ;;
esac
