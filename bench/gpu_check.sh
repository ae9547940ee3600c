#!/usr/bin/env bash
# End-to-end check on a machine with an NVIDIA GPU (real NVML, real CUDA context).
#
#   bench/gpu_check.sh [OUT_DIR]        (default OUT_DIR: $OUT, else test-artifacts/gpu-check)
#
# 1. starts the service (`gpuroster serve`) on a temporary SQLite data dir;
# 2. registers this host (`gpuroster admin add-host`) and an admin (`gpuroster admin create-user`,
#    `gpuroster admin create-token`) to read the API;
# 3. starts a CUDA process (python + ctypes: cuInit, cuCtxCreate, cuMemAlloc on GPU 0 through
#    libcuda.so.1, no torch) as a user without any reservation: a throw-away account
#    `gpuroster-check` when run as root, else the current user;
#    where a container runtime (docker, podman) answers and a local image with python3 exists
#    (GPU_CHECK_IMAGE, else the first local cuda/pytorch/python image), also starts the same CUDA
#    process in a container labelled `org.gpuroster.user=checker` (what `gpuroster env --docker`
#    prints), which runs as root on the host;
# 4. runs the agent against real NVML: `--print` (the admin's nvidia-smi-like view) and `--once`
#    (posts one snapshot to the service);
# 5. saves the agent's snapshot, the service's GET /api/v1/devices and a summary to OUT_DIR, and
#    `nvidia-smi -q -x` taken beside the agent's reading (`nvidia-smi-q-x-busy.xml`: a capture the
#    replay source can play back, to compare with what the agent read from NVML);
# 6. only with GPU_CHECK_EXCLUSIVE=1, as root, and while the GPUs run no compute process but this
#    script's own: enforcement on the real GPU. Two throw-away accounts `gr-holder` and
#    `gr-intruder` (the first free uids from 20001) each start the same CUDA process on GPU 0;
#    gr-holder has reserved GPU 0 through the API, the host's policy is `terminate` with a 3 s
#    grace, and the agent runs as a daemon at a 1 s interval (not a dry run). The agent must
#    signal the intruder's process, which must be gone, and leave the holder's running;
# 7. under the same conditions, where `nvidia-cuda-mps-control` is installed and no MPS control
#    daemon runs yet: the same CUDA process twice as gr-intruder under the Multi-Process Service.
#    The agent must list both MPS clients and the MPS server with gr-intruder as their owner (the
#    control daemon starts the server under its clients' uid); saves `nvidia-smi-q-x-mps.xml` and
#    `agent-print-mps.json`. The daemon is stopped again, also when the script is interrupted.
#
# Steps 6 and 7 act on the whole host: the agent of step 6 signals every unreserved GPU job of
# any account (the throw-away service knows only this script's reservation), and an MPS control
# daemon draws every new CUDA process of the host into MPS. Hence GPU_CHECK_EXCLUSIVE=1: run them
# only on a machine nobody else uses. Accounts this script creates are deleted at its end.
#
# Exit status: 0 when the agent saw the CUDA process on a GPU, attributed the container's
# process (if one was started) to the label's owner, the service lists the GPUs and, where they
# ran, enforcement stopped the intruder's process alone and the MPS processes were attributed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT_DIR=${1:-${OUT:-$ROOT/test-artifacts/gpu-check}}
BIN=${VENV_BIN:-$ROOT/.venv/bin}
PORT=${PORT:-18765}
URL="http://127.0.0.1:$PORT"
WORK=$(mktemp -d /tmp/gpuroster-gpu-check.XXXXXX)
chmod 755 "$WORK"
mkdir -p "$OUT_DIR"
PIDS=()
RUNTIME=""
CONTAINER_ID=""

CREATED_USERS=()   # accounts this run created, deleted at the end
MPSC=""            # the MPS control program, set when this run started its daemon

cleanup() {
    if [ -n "$CONTAINER_ID" ]; then "$RUNTIME" rm -f "$CONTAINER_ID" >/dev/null 2>&1 || true; fi
    for pid in "${PIDS[@]:-}"; do
        if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    done
    wait 2>/dev/null || true
    if [ -n "$MPSC" ]; then  # before $WORK goes: the daemon's pipe directory is in it
        echo quit | CUDA_MPS_PIPE_DIRECTORY="$WORK/mps-pipe" timeout 20 "$MPSC" >/dev/null 2>&1 || true
    fi
    for name in "${CREATED_USERS[@]:-}"; do
        if [ -n "$name" ]; then userdel "$name" >/dev/null 2>&1 || true; fi
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# api METHOD PATH [TOKEN] [JSON]: the answer's body on stdout; non-zero status on a transport
# error or, with API_FAIL=1, on an HTTP error. Python and httpx (an agent dependency) rather
# than curl, which a GPU host's image may lack.
api() {
    "$BIN/python" - "$URL" "$@" <<'PY'
import os, sys, httpx
url, method, path = sys.argv[1:4]
token = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
body = sys.argv[5] if len(sys.argv) > 5 else None
headers = {"Authorization": f"Bearer {token}"} if token else {}
if body is not None:
    headers["Content-Type"] = "application/json"
try:
    r = httpx.request(method, url + path, headers=headers, content=body, timeout=30, trust_env=False)
except httpx.HTTPError as exc:
    sys.exit(f"{method} {path}: {exc}")
sys.stdout.write(r.text)
sys.exit(1 if os.environ.get("API_FAIL") == "1" and r.status_code >= 400 else 0)
PY
}

log() { printf '[gpu_check] %s\n' "$*" | tee -a "$OUT_DIR/summary.txt" >&2; }
# the pid that a cuda_hold.py writing to log $1 says it holds GPU 0 as, once it says so (at
# most 30 s; less if process $2, when given, ends first); empty if it never does. runuser
# forks, so the CUDA process is the launcher's child and names its own pid.
holding_pid() {
    for _ in $(seq 1 60); do
        grep -q "holding GPU 0" "$1" 2>/dev/null && break
        if [ -n "${2:-}" ]; then kill -0 "$2" 2>/dev/null || break; fi
        sleep 0.5
    done
    sed -n 's/^holding GPU 0 as pid \([0-9]*\)$/\1/p' "$1" 2>/dev/null || true
}
: > "$OUT_DIR/summary.txt"

export GPUROSTER_DATA_DIR="$WORK/data"
export GPUROSTER_ENVIRONMENT=development
mkdir -p "$GPUROSTER_DATA_DIR"

log "host $(hostname), driver: $(cat /proc/driver/nvidia/version 2>/dev/null | head -1 || echo 'no /proc/driver/nvidia')"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi -q -x > "$OUT_DIR/nvidia-smi-q-x.xml" 2>&1 || log "nvidia-smi -q -x failed (rc $?)"
    nvidia-smi > "$OUT_DIR/nvidia-smi.txt" 2>&1 || true
fi

# -- 1. the service -------------------------------------------------------------------------
"$BIN/gpuroster" serve --host 127.0.0.1 --port "$PORT" > "$OUT_DIR/service.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 60); do
    API_FAIL=1 api GET /healthz >/dev/null 2>&1 && break
    sleep 0.5
done
API_FAIL=1 api GET /healthz >/dev/null || { log "service did not start; see service.log"; exit 1; }
log "service up at $URL"

# -- 2. host and admin ----------------------------------------------------------------------
HOST=$(hostname)
"$BIN/gpuroster" admin add-host "$HOST" > "$WORK/host.token"
chmod 600 "$WORK/host.token"
printf 'gpu-check-%s\n' "$RANDOM$RANDOM" | "$BIN/gpuroster" admin create-user checker --admin --password-stdin >/dev/null
ADMIN_TOKEN=$("$BIN/gpuroster" admin create-token checker --name gpu-check | tail -1)

# -- 3. a CUDA process of a user without a reservation ---------------------------------------
cat > "$WORK/cuda_hold.py" <<'PY'
"""Hold a CUDA context and 256 MiB on GPU 0 for a while (ctypes over libcuda.so.1)."""
import ctypes, os, sys, time

cuda = ctypes.CDLL("libcuda.so.1")
def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed with CUDA error {rc}")
check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate_v2")
ptr = ctypes.c_uint64()
check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), 256 << 20), "cuMemAlloc_v2")
print("holding GPU 0 as pid", os.getpid(), flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 120)
PY
chmod 644 "$WORK/cuda_hold.py"
PYTHON_FOR_CUDA=${PYTHON_FOR_CUDA:-$(command -v python3 || echo "$BIN/python")}  # any python3 the CUDA users may run
if [ "$(id -u)" = 0 ]; then
    CUDA_USER=gpuroster-check
    if ! id "$CUDA_USER" >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /usr/sbin/nologin "$CUDA_USER" 2>/dev/null \
            || useradd -r -M -s /bin/false "$CUDA_USER"
        CREATED_USERS+=("$CUDA_USER")
    fi
    # a system account has uid < 1000: the service will call it exempt; that is still an
    # unreserved process the agent must see and attribute.
    runuser -u "$CUDA_USER" -- "$PYTHON_FOR_CUDA" "$WORK/cuda_hold.py" 120 > "$OUT_DIR/cuda.log" 2>&1 &
else
    CUDA_USER=$(id -un)
    "$PYTHON_FOR_CUDA" "$WORK/cuda_hold.py" 120 > "$OUT_DIR/cuda.log" 2>&1 &
fi
CUDA_PID=$!
PIDS+=("$CUDA_PID")
REAL_CUDA_PID=$(holding_pid "$OUT_DIR/cuda.log" "$CUDA_PID")
[ -n "$REAL_CUDA_PID" ] || { log "CUDA process failed: $(tail -3 "$OUT_DIR/cuda.log")"; exit 1; }
log "CUDA process pid $REAL_CUDA_PID as $CUDA_USER (no reservation)"

# -- 3b. the same CUDA process in a container carrying its owner label ------------------------
for rt in docker podman; do
    if command -v "$rt" >/dev/null 2>&1 && timeout 20 "$rt" info >/dev/null 2>&1; then RUNTIME=$rt; break; fi
done
IMAGE=${GPU_CHECK_IMAGE:-}
if [ -n "$RUNTIME" ] && [ -z "$IMAGE" ]; then
    IMAGE=$("$RUNTIME" images --format '{{.Repository}}:{{.Tag}}' 2>/dev/null | grep -Ei 'cuda|pytorch|python' | grep -v '<none>' | head -1 || true)
fi
if [ -n "$RUNTIME" ] && [ -n "$IMAGE" ]; then
    GPU0_UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 2>/dev/null | head -1 || true)
    CONTAINER_ID=$("$RUNTIME" run -d --gpus "\"device=${GPU0_UUID:-0}\"" --label org.gpuroster.user=checker \
        --name "gpuroster-check-$$" -v "$WORK:/job:ro" "$IMAGE" python3 /job/cuda_hold.py 120 2> "$OUT_DIR/container.log") \
        || CONTAINER_ID=""
    for _ in $(seq 1 60); do
        [ -n "$CONTAINER_ID" ] || break
        "$RUNTIME" logs "$CONTAINER_ID" 2>&1 | grep -q "holding GPU 0" && break
        sleep 0.5
    done
    if [ -n "$CONTAINER_ID" ] && "$RUNTIME" logs "$CONTAINER_ID" 2>&1 | grep -q "holding GPU 0"; then
        log "container ${CONTAINER_ID:0:12} ($IMAGE, $RUNTIME) holds GPU 0 as root, label org.gpuroster.user=checker"
    else
        log "container did not start on $RUNTIME with $IMAGE: $(tail -2 "$OUT_DIR/container.log" 2>/dev/null)"
        [ -n "$CONTAINER_ID" ] && "$RUNTIME" logs "$CONTAINER_ID" > "$OUT_DIR/container.log" 2>&1
        [ -n "$CONTAINER_ID" ] && "$RUNTIME" rm -f "$CONTAINER_ID" >/dev/null 2>&1
        CONTAINER_ID=""
    fi
else
    log "no container runtime with a local python image here: container attribution not checked"
fi
sleep 2  # let NVML list them

# -- 4. the agent on real NVML --------------------------------------------------------------
printf '' > "$WORK/none.toml"  # an empty config: nothing from /etc/gpuroster leaks into the check
set +e
command -v nvidia-smi >/dev/null && nvidia-smi -q -x > "$OUT_DIR/nvidia-smi-q-x-busy.xml" 2>&1
"$BIN/gpuroster-agent" --print --expect-gpus --config "$WORK/none.toml" > "$OUT_DIR/agent-print.json" 2> "$OUT_DIR/agent-print.log"
PRINT_RC=$?
"$BIN/gpuroster-agent" --once --expect-gpus --config "$WORK/none.toml" --server "$URL" --token-file "$WORK/host.token" \
    --host "$HOST" --state-dir "$WORK/agent-state" > "$OUT_DIR/agent-once.txt" 2>&1
ONCE_RC=$?
# a short daemon run: three polls at 1 s, then SIGTERM
timeout -s TERM 4 "$BIN/gpuroster-agent" --expect-gpus --config "$WORK/none.toml" --server "$URL" \
    --token-file "$WORK/host.token" --host "$HOST" --state-dir "$WORK/agent-state" --interval 1 > "$OUT_DIR/agent-daemon.log" 2>&1
set -e
log "agent --print rc=$PRINT_RC, --once rc=$ONCE_RC ($(head -1 "$OUT_DIR/agent-once.txt"))"

# -- 5. what the service knows ---------------------------------------------------------------
api GET /api/v1/devices "$ADMIN_TOKEN" > "$OUT_DIR/devices.json" || true
api GET /metrics > "$OUT_DIR/metrics.txt" 2>/dev/null || true

# -- 6. enforcement on the real GPU: the holder's job is spared, the intruder's is stopped ----
ENFORCE=skipped MPS=skipped
declare -A JOB UID_OF
# compute processes on the GPUs that this script did not start (nvidia-smi's pids)
others=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ' \
    | grep -v -x -e "$REAL_CUDA_PID" | grep -v -x -e '' || true)
if [ "${GPU_CHECK_EXCLUSIVE:-0}" != 1 ]; then
    log "enforcement and MPS not checked: they act on the whole host; set GPU_CHECK_EXCLUSIVE=1 on a machine nobody else uses"
elif [ "$(id -u)" != 0 ]; then
    log "enforcement and MPS not checked: they need root (throw-away accounts, signals)"
elif [ -n "$CONTAINER_ID" ] || [ -n "$others" ]; then
    log "enforcement and MPS not checked: the GPUs run other compute processes ($(echo $others | tr '\n' ' ')${CONTAINER_ID:+ and the container of step 3})"
else
    ENFORCE=fail
    accounts=ok uid=20001
    for name in gr-holder gr-intruder; do
        if ! id "$name" >/dev/null 2>&1; then
            while getent passwd "$uid" >/dev/null; do uid=$((uid + 1)); done
            if ! useradd -M -u "$uid" -s /bin/false "$name"; then
                log "useradd $name (uid $uid) failed"
                accounts=failed
                break
            fi
            CREATED_USERS+=("$name")
        fi
        UID_OF[$name]=$(id -u "$name")
        uid=$(( ${UID_OF[$name]} + 1 ))
        # the service knows them by the same name; the uid is given too, as for directory users
        "$BIN/gpuroster" admin create-user "$name" --no-password --unix-uid "${UID_OF[$name]}" >/dev/null
    done
    if [ $accounts = ok ] && ! runuser -u gr-intruder -- "$PYTHON_FOR_CUDA" -c pass 2>/dev/null; then
        log "the throw-away accounts cannot run $PYTHON_FOR_CUDA: set PYTHON_FOR_CUDA to a python3 they may run"
        accounts=failed
    fi
    [ $accounts = ok ] && HOLDER_TOKEN=$("$BIN/gpuroster" admin create-token gr-holder --name gpu-check | tail -1)
    if [ $accounts = ok ] && API_FAIL=1 api POST /api/v1/reservations "$HOLDER_TOKEN" \
            "{\"host\": \"$HOST\", \"devices\": [0], \"start\": \"now\", \"duration\": \"PT30M\"}" > "$OUT_DIR/enforce-reservation.json" \
        && API_FAIL=1 api PATCH "/api/v1/hosts/$HOST" "$ADMIN_TOKEN" '{"policy": "terminate", "grace_seconds": 3}' \
            > "$OUT_DIR/enforce-policy.json"; then
        for name in gr-holder gr-intruder; do
            runuser -u "$name" -- "$PYTHON_FOR_CUDA" "$WORK/cuda_hold.py" 90 > "$OUT_DIR/cuda-$name.log" 2>&1 &
            PIDS+=($!)
            JOB[$name]=$(holding_pid "$OUT_DIR/cuda-$name.log")
        done
        log "enforcement: holder pid ${JOB[gr-holder]:-none}, intruder pid ${JOB[gr-intruder]:-none} (uids ${UID_OF[gr-holder]}, ${UID_OF[gr-intruder]})"
        timeout -s TERM 20 "$BIN/gpuroster-agent" --expect-gpus --config "$WORK/none.toml" --server "$URL" \
            --token-file "$WORK/host.token" --host "$HOST" --state-dir "$WORK/agent-state" --interval 1 \
            > "$OUT_DIR/agent-enforce.log" 2>&1 || true
        api GET /api/v1/findings "$ADMIN_TOKEN" > "$OUT_DIR/enforce-findings.json" || true
        holder_alive=no intruder_alive=no
        if [ -n "${JOB[gr-holder]}" ] && kill -0 "${JOB[gr-holder]}" 2>/dev/null; then holder_alive=yes; fi
        if [ -n "${JOB[gr-intruder]}" ] && kill -0 "${JOB[gr-intruder]}" 2>/dev/null; then intruder_alive=yes; fi
        # gone is not enough: the agent must have signalled it, and judged nobody else
        judged=$("$BIN/python" - "$OUT_DIR/enforce-findings.json" "${JOB[gr-intruder]:-0}" <<'PY' || echo "unreadable"
import json, sys
items = json.load(open(sys.argv[1]))["items"]
mine = [f for f in items if f["pid"] == int(sys.argv[2])]
print("intruder terminated, no other finding" if len(mine) == 1 == len(items) and mine[0]["state"] == "terminated"
      and mine[0]["unix_user"] == "gr-intruder" else f"findings: {[(f['pid'], f['unix_user'], f['state']) for f in items]}")
PY
)
        if [ -n "${JOB[gr-holder]}" ] && [ -n "${JOB[gr-intruder]}" ] && [ $holder_alive = yes ] && [ $intruder_alive = no ] \
            && [ "$judged" = "intruder terminated, no other finding" ]; then
            ENFORCE=pass
        fi
        log "enforcement: holder alive=$holder_alive, intruder alive=$intruder_alive after 20 s of the agent; $judged: $ENFORCE"
        if [ -n "${JOB[gr-holder]}" ]; then kill "${JOB[gr-holder]}" 2>/dev/null || true; fi
    elif [ $accounts = ok ]; then
        log "enforcement: the reservation or the policy was refused: $(head -c 300 "$OUT_DIR/enforce-reservation.json" "$OUT_DIR/enforce-policy.json" 2>/dev/null)"
    fi

    # -- 7. MPS: the clients and their server are the clients' user's ---------------------------
    mps_control=$(command -v nvidia-cuda-mps-control || true)
    if [ $accounts != ok ]; then
        log "MPS not checked: no throw-away account"
    elif [ -z "$mps_control" ]; then
        log "MPS not checked: nvidia-cuda-mps-control is not installed"
    elif pgrep -f nvidia-cuda-mps-control >/dev/null 2>&1; then
        log "MPS not checked: this host already runs an MPS control daemon, left alone"
    else
        MPS=fail
        export CUDA_MPS_PIPE_DIRECTORY="$WORK/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$WORK/mps-log"
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        chmod 1777 "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        if "$mps_control" -d; then
            MPSC=$mps_control  # cleanup stops it from here on
            CLIENTS=()
            for i in 1 2; do
                runuser -u gr-intruder -- "$PYTHON_FOR_CUDA" "$WORK/cuda_hold.py" 60 > "$OUT_DIR/cuda-mps-$i.log" 2>&1 &
                PIDS+=($!)
            done
            for i in 1 2; do
                CLIENTS+=("$(holding_pid "$OUT_DIR/cuda-mps-$i.log")")
            done
            sleep 1
            nvidia-smi -q -x > "$OUT_DIR/nvidia-smi-q-x-mps.xml" 2>&1 || true
            "$BIN/gpuroster-agent" --print --expect-gpus --config "$WORK/none.toml" > "$OUT_DIR/agent-print-mps.json" \
                2> "$OUT_DIR/agent-print-mps.log" || true
            MPS=$("$BIN/python" - "$OUT_DIR/agent-print-mps.json" "${CLIENTS[@]}" <<'PY'
import json, sys
procs = json.load(open(sys.argv[1]))["processes"]
clients = {int(p) for p in sys.argv[2:] if p}
listed = {p["pid"]: p for p in procs}
servers = [p for p in procs if p["name"] == "nvidia-cuda-mps-server"]
ok = len(clients) == 2 and clients <= set(listed) and len(servers) == 1 and all(
    listed[pid]["unix_user"] == "gr-intruder" for pid in clients | {servers[0]["pid"]})
print("pass" if ok else "fail")
PY
) || MPS=fail
            for pid in "${CLIENTS[@]}"; do
                if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
            done
            echo quit | timeout 30 "$MPSC" || true
            MPSC=""
            log "MPS: clients ${CLIENTS[*]} of gr-intruder; agent's attribution: $MPS"
        else
            log "MPS: the control daemon did not start"
        fi
    fi
fi

"$BIN/python" - "$OUT_DIR" "$REAL_CUDA_PID" "$CUDA_USER" "$CONTAINER_ID" "$ENFORCE" "$MPS" <<'PY' | tee -a "$OUT_DIR/summary.txt"
import json, sys
out, pid, user, container, enforce, mps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
snap = json.load(open(f"{out}/agent-print.json"))
print(f"monitoring: {snap['monitoring']}; stale={snap['stale']} suspect={snap['suspect']} "
      f"driver={snap['driver_version']} nvml={snap['nvml_version']} cuda={snap['cuda_version']} binding={snap['binding_version']}")
for d in snap["devices"]:
    print(f"device {d['index']} {d['uuid']} {d['name']} bus={d['pci_bus_id']} mem={d['memory_used_mib']}/{d['memory_total_mib']} MiB "
          f"util={d['utilization_gpu']}% temp={d['temperature_c']}C power={d['power_draw_w']}/{d['power_limit_w']} W "
          f"health={d['health']} procs={d['processes_status']}")
mine = [p for p in snap["processes"] if p["pid"] == pid]
for p in snap["processes"]:
    print(f"process {p['pid']} {p['type']} on {p['device_uuid']}: user={p['unix_user']} uid={p['uid']} "
          f"status={p['owner_status']} source={p.get('owner_source')} identity={p.get('identity')} exe={p.get('exe')} "
          f"mem={p['used_memory_mib']} MiB container={(p.get('container_id') or '')[:12]} {p.get('container_name') or ''} "
          f"{p.get('container_image') or ''} cmd={(p['command'] or '')[:80]}")
try:
    devices = json.load(open(f"{out}/devices.json"))
    listed = len(devices) if isinstance(devices, list) else devices
except ValueError:
    listed = "unreadable"
print(f"service lists devices: {listed}")
ok = bool(mine) and mine[0]["unix_user"] == user and isinstance(listed, int) and listed >= 1
boxed = [p for p in snap["processes"] if container and p.get("container_id") == container]
if container:
    who = [(p["uid"], p["unix_user"], p.get("owner_source")) for p in boxed]
    print(f"container {container[:12]}: processes (uid, attributed to, by) {who}")
    ok = ok and bool(boxed) and all(p["unix_user"] == "checker" and p.get("owner_source") == "label" for p in boxed)
ok = ok and enforce != "fail" and mps != "fail"
print("RESULT:", "PASS" if ok else "FAIL", f"(CUDA pid {pid} seen: {bool(mine)}, attributed to {mine[0]['unix_user'] if mine else None}"
      + (f"; container processes attributed to {sorted({p['unix_user'] for p in boxed})}" if container else "")
      + f"; enforcement: {enforce}; MPS: {mps})")
sys.exit(0 if ok else 1)
PY
