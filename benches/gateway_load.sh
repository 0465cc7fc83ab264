#!/usr/bin/env bash
# The load test of `lanekeeper gateway` (docs/performance.md, "The gateway
# under load"): lanekeeper-fake-model on loopback with no service time, and
# the same load sent to it directly, through `lanekeeper gateway` (with the
# system allocator it ships with, and built with mimalloc for comparison),
# through `bare` (benches/bare_proxy.rs: the same HTTP stack, hyper's server
# and client, forwarding with no policy: the floor lanekeeper is built on),
# through nginx (Debian's package, limit_req keyed by the lane header) and
# through the LiteLLM proxy (PyPI, a per-lane rpm limit), all in one run:
#
#   (a) open loop at RATE requests/s over CONNECTIONS keep-alive connections:
#       p50/p99 latency and the latency added over going direct;
#   (b) closed loop with CONNECTIONS clients: the highest sustained rate, and
#       each proxy's CPU (user and system, from /proc, all its processes)
#       per answered request, which other load on the machine moves far
#       less than it moves rates and latencies;
#   (c) the resident memory of `lanekeeper gateway` with 100 lanes, 10,000
#       tenants and 2,000 requests queued.
#
# Usage: bash benches/gateway_load.sh [all|latency|memory]   (default: all)
#
# Environment (defaults in brackets): RATE [2000], CONNECTIONS [64],
# DURATION seconds measured per case [10], WARMUP seconds [3], ROUNDS [3]
# (each figure is the median over the rounds), LANE_RPS, the per-lane limit
# every proxy enforces, far above the measured rates [50000], TENANTS the
# requests are spread over [1000], PROXY_THREADS [1] (lanekeeper's runtime
# threads = nginx's worker processes = LiteLLM's workers), PIN [1] (with 2
# or more cores: the proxy under test on PROXY_CPUS [1], the load generator
# and the fake model on LOAD_CPUS [0], with taskset; 0 leaves placement to
# the kernel), BASELINE (the path of another build of `lanekeeper`, e.g.
# main's before a change: also measured, as `lanekeeper-baseline`, on the
# same config and flags), MIMALLOC [1] (also measure lanekeeper built with
# mimalloc, `--features mimalloc`), TLS [1] (also measure lanekeeper and
# nginx each terminating TLS, `lanekeeper-tls` and `nginx-tls`, with a test
# CA and certificate made here with openssl), APIKEY [1] (also measure
# lanekeeper and nginx each checking an API key, `lanekeeper-apikey` with
# `--credentials` holding the SHA-256 of API_KEYS [1000] keys and
# `nginx-apikey` with a map of the same keys' Authorization headers, 401 for
# any other; the load sends one of the keys), SHARED [1] (also measure
# `lanekeeper-shared`, the gateway with `--shared-state` on a local
# `redis-server` (Debian's; `valkey-server` when installed), and the store's
# operations per second during its open-loop run, from `redis-cli info
# stats` total_commands_processed), PRICED [1] (also measure
# `lanekeeper-priced`, the same config with every lane priced per token
# (`cost`), so each answer is read for its `usage` and settled), LITELLM [1] (0 leaves LiteLLM
# out), LANEKEEPER_CACHE
# [~/.cache/lanekeeper] (LiteLLM's virtualenv), LITELLM_VERSION [1.108.7],
# KEEP (a directory to copy the raw results and logs into), SKIP_BUILD (use
# the binaries already built).
#
# Every request carries the lane header, a unique x-request-id and one of
# TENANTS tenants (x-lanekeeper-tenant), as a real client's would.
#
# It installs what is missing (nginx and jq from Debian, LiteLLM into a
# virtualenv under LANEKEEPER_CACHE), sends traffic to loopback only, and
# stops every process it started when it exits.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

WHAT=${1:-all}
case "$WHAT" in
all | latency | memory) ;;
*)
	echo "usage: bash benches/gateway_load.sh [all|latency|memory]" >&2
	exit 2
	;;
esac

RATE=${RATE:-2000}
CONNECTIONS=${CONNECTIONS:-64}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-3}
ROUNDS=${ROUNDS:-3}
LANE_RPS=${LANE_RPS:-50000}
TENANTS=${TENANTS:-1000}
PROXY_THREADS=${PROXY_THREADS:-1}
PIN=${PIN:-1}
PROXY_CPUS=${PROXY_CPUS:-1}
LOAD_CPUS=${LOAD_CPUS:-0}
MIMALLOC=${MIMALLOC:-1}
TLS=${TLS:-1}
APIKEY=${APIKEY:-1}
SHARED=${SHARED:-1}
PRICED=${PRICED:-1}
API_KEYS=${API_KEYS:-1000}
# The key the load sends (the last of the API_KEYS made by make_keys).
API_KEY=none
LITELLM_KEY=none
LITELLM=${LITELLM:-1}
LITELLM_VERSION=${LITELLM_VERSION:-1.108.7}
CACHE=${LANEKEEPER_CACHE:-$HOME/.cache/lanekeeper}
MEM_LANES=100
MEM_TENANTS=10000
MEM_QUEUED=2000
# Per-lane rate of the memory config: low, so that the clients' requests wait.
MEM_LANE_RPS=${MEM_LANE_RPS:-2}

log() { echo "== $*" >&2; }

# ---- what it needs ---------------------------------------------------------

apt_install() {
	if [ "$(id -u)" -ne 0 ]; then
		echo "missing $*: install it (apt-get install $*) or run as root" >&2
		exit 1
	fi
	log "installing $* from Debian"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
for tool in jq curl python3 taskset openssl; do
	command -v "$tool" >/dev/null || apt_install "$tool"
done
if [ "$WHAT" != memory ]; then
	[ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || apt_install nginx
	if [ "$SHARED" = 1 ]; then
		command -v valkey-server >/dev/null || command -v redis-server >/dev/null || apt_install redis-server
		command -v valkey-cli >/dev/null || command -v redis-cli >/dev/null || apt_install redis-tools
	fi
	NGINX=$(command -v nginx || echo /usr/sbin/nginx)
	LITELLM_VENV=$CACHE/litellm
	LITELLM_INSTALLED=none
	if [ "$LITELLM" = 1 ]; then
		if [ ! -x "$LITELLM_VENV/bin/litellm" ]; then
			log "installing litellm[proxy]==$LITELLM_VERSION into $LITELLM_VENV (a few minutes)"
			mkdir -p "$CACHE"
			python3 -m venv "$LITELLM_VENV"
			"$LITELLM_VENV/bin/pip" install -q "litellm[proxy]==$LITELLM_VERSION"
		fi
		LITELLM_INSTALLED=$("$LITELLM_VENV/bin/pip" show litellm | awk '/^Version:/ {print $2}')
	fi
fi

TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)
if [ -z "${SKIP_BUILD:-}" ]; then
	log "building the release binaries and the load generator"
	if [ "$MIMALLOC" = 1 ] && [ "$WHAT" != memory ]; then
		# The mimalloc build first, kept under its own name: the
		# default build below overwrites target/release/lanekeeper.
		cargo build --release --bin lanekeeper --features mimalloc --quiet
		cp "$TARGET_DIR/release/lanekeeper" "$TARGET_DIR/release/lanekeeper-mimalloc"
	fi
	cargo build --release --bins --quiet
	benches=$(cargo bench --bench gateway_load --bench bare_proxy --no-run --message-format=json --quiet)
	bench_binary() {
		jq -r --arg n "$1" 'select(.reason == "compiler-artifact" and .target.name == $n and .executable != null) | .executable' <<<"$benches" | tail -n 1
	}
else
	# The newest build of the bench NAME.
	bench_binary() {
		local f found=
		for f in "$TARGET_DIR"/release/deps/"$1"-*; do
			[ -x "$f" ] && [ "${f%.d}" = "$f" ] && { [ -z "$found" ] || [ "$f" -nt "$found" ]; } && found=$f
		done
		echo "$found"
	}
fi
GEN=$(bench_binary gateway_load)
BARE=$(bench_binary bare_proxy)
for f in "$GEN" "$BARE"; do
	[ -x "$f" ] || {
		echo "could not find the gateway_load and bare_proxy bench binaries" >&2
		exit 1
	}
done
LANEKEEPER=$TARGET_DIR/release/lanekeeper
LANEKEEPER_MIMALLOC=$TARGET_DIR/release/lanekeeper-mimalloc
BASELINE=${BASELINE:-}
if [ -n "$BASELINE" ] && [ ! -x "$BASELINE" ]; then
	echo "BASELINE=$BASELINE is not an executable" >&2
	exit 1
fi
if [ "$MIMALLOC" = 1 ] && [ "$WHAT" != memory ] && [ ! -x "$LANEKEEPER_MIMALLOC" ]; then
	echo "no $LANEKEEPER_MIMALLOC: build without SKIP_BUILD, or MIMALLOC=0" >&2
	exit 1
fi

# Where the proxies and the load run: "${ON_PROXY[@]}" CMD... or
# "${ON_LOAD[@]}" CMD...
if [ "$PIN" = 1 ] && [ "$(nproc)" -ge 2 ]; then
	ON_PROXY=(taskset -c "$PROXY_CPUS")
	ON_LOAD=(taskset -c "$LOAD_CPUS")
	PLACEMENT="the proxy under test on CPU $PROXY_CPUS, the load generator and the fake model on CPU $LOAD_CPUS (taskset)"
else
	ON_PROXY=()
	ON_LOAD=()
	PLACEMENT="placed by the kernel (not pinned)"
fi
FAKE_MODEL=$TARGET_DIR/release/lanekeeper-fake-model

# ---- processes, stopped on exit ---------------------------------------------

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gateway-load.XXXXXX")
PIDS=()
# Stops every process started so far (each in its own process group, so
# LiteLLM's and nginx's workers too).
stop_all() {
	local pid
	[ "${#PIDS[@]}" -gt 0 ] || return 0
	for pid in "${PIDS[@]}"; do
		kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
	done
	sleep 1
	for pid in "${PIDS[@]}"; do
		kill -KILL -- "-$pid" 2>/dev/null || true
	done
	PIDS=()
}
cleanup() {
	stop_all
	if [ -n "${KEEP:-}" ]; then
		mkdir -p "$KEEP"
		cp -r "$WORK"/. "$KEEP"/
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts "$@" in its own process group, output to $WORK/$name.log.
start() {
	local name=$1
	shift
	setsid "$@" >"$WORK/$name.log" 2>&1 &
	PIDS+=("$!")
	LAST_PID=$!
	disown "$LAST_PID"
}

# The address a process printed as `listening on ADDR`.
listening_on() {
	local name=$1
	for _ in $(seq 1 300); do
		if grep -q 'listening on' "$WORK/$name.log" 2>/dev/null; then
			sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$WORK/$name.log" | head -n 1
			return
		fi
		kill -0 "$LAST_PID" 2>/dev/null || break
		sleep 0.1
	done
	echo "$name did not start:" >&2
	cat "$WORK/$name.log" >&2
	exit 1
}

# Waits for a 2xx from a URL (tries every 0.2 s).
wait_http() {
	local name=$1 url=$2 tries=${3:-300}
	for _ in $(seq 1 "$tries"); do
		curl -fsS -o /dev/null "$url" 2>/dev/null && return
		sleep 0.2
	done
	echo "$name did not answer $url:" >&2
	tail -n 50 "$WORK/$name.log" >&2
	exit 1
}

# Waits for a port to accept connections.
wait_port() {
	local name=$1 port=$2
	for _ in $(seq 1 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return
		sleep 0.1
	done
	echo "$name is not listening on $port:" >&2
	tail -n 50 "$WORK/$name.log" >&2
	exit 1
}

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
# The CPU a process group has used: "USER SYS" in clock ticks, summed over
# its live processes (nginx's and LiteLLM's workers are in their master's
# group). /proc/PID/stat after the ")" that ends the name: the group is the
# 3rd field, utime and stime the 12th and 13th.
group_cpu() {
	local f
	for f in /proc/[0-9]*/stat; do
		sed 's/.*) //' "$f" 2>/dev/null || true
	done | awk -v g="$1" '$3 == g { u += $12; s += $13 } END { print u + 0, s + 0 }'
}
CLK_TCK=$(getconf CLK_TCK)
# The process group of each target's proxy (set where it starts).
declare -A GROUP=()
hwm_kib() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }

# Many connections at once (the memory step holds 2,000).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

LANES=(p0-disruption-assist p1-agent-assist p2-email-extract p3-shift-batch p4-eval-backfill)
ROUTES=(--route agent-large="http://FAKE" --route extract-small="http://FAKE"
	--route batch-medium="http://FAKE" --route eval-large="http://FAKE")

start_fake_model() {
	start "$1" "${ON_LOAD[@]}" "$FAKE_MODEL" --listen 127.0.0.1:0 --service-millis 0 --token-millis 0
	FAKE=$(listening_on "$1")
}

# start_gateway NAME CONFIG [BINARY [FLAG...]]: the proxy under test,
# PROXY_THREADS runtime threads. With GW_AUTH set (e.g. --credentials FILE)
# it replaces --trust-lane-header.
start_gateway() {
	local name=$1 config=$2 binary=${3:-$LANEKEEPER}
	shift $(($# < 3 ? $# : 3))
	# --trust-lane-header: the lane and tenant from the headers, as nginx
	# and LiteLLM take them here (no credential on either side).
	local auth=(--trust-lane-header)
	[ "${#GW_AUTH[@]}" -gt 0 ] && auth=("${GW_AUTH[@]}")
	start "$name" "${ON_PROXY[@]}" "$binary" gateway --listen 127.0.0.1:0 --metrics-addr 127.0.0.1:0 \
		--worker-threads "$PROXY_THREADS" --config "$config" "${auth[@]}" "${ROUTES[@]//FAKE/$FAKE}" "$@"
	GW_PID=$LAST_PID
	GROUP[$name]=$GW_PID
	GW=$(listening_on "$name")
	GW_METRICS=$(sed -n 's/.*listening on [^ ]* metrics on \([^ ]*\).*/\1/p' "$WORK/$name.log" | head -n 1)
	wait_http "$name" "http://$GW_METRICS/readyz"
}

# The shared store (--shared-state) on a free loopback port, no
# persistence, on the load's CPUs: STORE_PORT, STORE_CLI.
start_store() {
	local server
	server=$(command -v valkey-server || command -v redis-server)
	STORE_CLI=$(command -v valkey-cli || command -v redis-cli)
	STORE_PORT=$(free_port)
	start store "${ON_LOAD[@]}" "$server" --port "$STORE_PORT" --bind 127.0.0.1 --save "" --appendonly no
	wait_port store "$STORE_PORT"
	STORE_VERSION=$("$server" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')
}

# Waits until a gateway enforces the fleet's budgets (the store answered).
wait_shared() {
	for _ in $(seq 1 100); do
		curl -fsS "$1" | grep -q '^lanekeeper_gateway_shared_state_mode{mode="shared"} 1' && return
		sleep 0.1
	done
	echo "the shared gateway never reached the store" >&2
	exit 1
}

# Commands the store processed so far.
store_commands() {
	"$STORE_CLI" -p "$STORE_PORT" info stats | tr -d '\r' | sed -n 's/^total_commands_processed://p'
}

# A test CA and a certificate for 127.0.0.1 (ECDSA P-256) in $WORK/tls.
make_certs() {
	local d=$WORK/tls
	mkdir -p "$d"
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
		-subj /CN=gateway-load-ca -keyout "$d/ca.key" -out "$d/ca.crt" \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 \
		-keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null
	printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' >"$d/ext.cnf"
	openssl x509 -req -in "$d/server.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
		-days 2 -extfile "$d/ext.cnf" -out "$d/server.crt" 2>/dev/null
	TLS_ARGS=(--ca "$d/ca.crt")
}
TLS_ARGS=()
GW_AUTH=()

# API_KEYS random keys: $WORK/credentials.yaml (their SHA-256, each its own
# tenant, every lane) for lanekeeper, $WORK/nginx-keys.map (each key's
# Authorization header) for nginx; API_KEY is the last one.
make_keys() {
	local lanes i key
	lanes=$(
		IFS=,
		echo "${LANES[*]}"
	)
	echo "apiKeys:" >"$WORK/credentials.yaml"
	: >"$WORK/nginx-keys.map"
	for i in $(seq 1 "$API_KEYS"); do
		key=sk-bench-$(openssl rand -hex 20)
		printf '  - sha256: %s\n    tenant: tenant-%s\n    lanes: [%s]\n' \
			"$(printf %s "$key" | sha256sum | cut -d' ' -f1)" "$i" "$lanes" >>"$WORK/credentials.yaml"
		printf '    "Bearer %s" 1;\n' "$key" >>"$WORK/nginx-keys.map"
		API_KEY=$key
	done
}

machine() {
	log "machine: $(nproc) cores, $(awk '/^MemTotal:/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1); load average $(cut -d' ' -f1-3 /proc/loadavg)"
}

# ---- (a) and (b): latency and throughput --------------------------------------

latency() {
	start_fake_model fake-model

	# lanekeeper: the INC-47 lanes, each Admitted at LANE_RPS with a burst of
	# one second, no floors, no deferral, no context trimming; the in-flight
	# watermarks far above the load (the slots kept for P0, which is never
	# shed, are its bucket's size: with INC-47's stopAt of 1,500 they would
	# take every slot and hold the other lanes at the limit).
	jq --argjson r "$LANE_RPS" '
		.level = 0 | .levelName = "normal"
		| .flags.rejectOptionalContext = false
		| .inFlight = {conserveAt: 900000, stopAt: 1000000, resumeBelow: 800000}
		| .lanes |= map(.state = "Admitted" | .admittedRequestsPerSecond = $r
			| .admittedUnitsPerSecond = ($r * .workUnitsPerRequest) | .burst = $r
			| .floorUnitsPerSecond = null | .deferral = null | .optionalContext = null
			| .borrowing = [] | .retry.maxAttempts = 3 | .retry.budgetPercent = 5)
		| .contentHash = "sha256:gateway-load-bench"' \
		examples/inc-47/lanes-420.json >"$WORK/lanes.json"
	start_gateway lanekeeper "$WORK/lanes.json"
	local lk_pid=$GW_PID lk_url=$GW
	# The floor: the same HTTP stack forwarding with no policy.
	start bare "${ON_PROXY[@]}" "$BARE" --listen 127.0.0.1:0 --upstream "http://$FAKE" --worker-threads "$PROXY_THREADS"
	GROUP[bare]=$LAST_PID
	BARE_URL=http://$(listening_on bare)/v1/chat/completions
	if [ "$MIMALLOC" = 1 ]; then
		start_gateway lanekeeper-mimalloc "$WORK/lanes.json" "$LANEKEEPER_MIMALLOC"
		MIMALLOC_URL=http://$GW/v1/chat/completions
	fi
	if [ -n "$BASELINE" ]; then
		start_gateway lanekeeper-baseline "$WORK/lanes.json" "$BASELINE"
		BASELINE_URL=http://$GW/v1/chat/completions
	fi
	if [ "$TLS" = 1 ]; then
		make_certs
		start_gateway lanekeeper-tls "$WORK/lanes.json" "$LANEKEEPER" \
			--tls-cert "$WORK/tls/server.crt" --tls-key "$WORK/tls/server.key"
		LK_TLS_URL=https://$GW/v1/chat/completions
	fi
	if [ "$APIKEY" = 1 ]; then
		make_keys
		GW_AUTH=(--credentials "$WORK/credentials.yaml")
		start_gateway lanekeeper-apikey "$WORK/lanes.json"
		GW_AUTH=()
		LK_APIKEY_URL=http://$GW/v1/chat/completions
	fi
	if [ "$SHARED" = 1 ]; then
		start_store
		start_gateway lanekeeper-shared "$WORK/lanes.json" "$LANEKEEPER" \
			--shared-state "redis://127.0.0.1:$STORE_PORT" --shared-state-timeout-millis 10
		wait_shared "http://$GW_METRICS/metrics"
		LK_SHARED_URL=http://$GW/v1/chat/completions
	fi
	if [ "$PRICED" = 1 ]; then
		# Every lane priced per token: each answer is kept to read its usage
		# and settled (the fake model reports usage on every answer). The
		# prices leave the buckets far above the measured rates.
		jq '.lanes |= map(.cost = {perRequest: 0.5, perInputToken: 0.001, perOutputToken: 0.002})
			| .contentHash = "sha256:gateway-load-bench-priced"' \
			"$WORK/lanes.json" >"$WORK/lanes-priced.json"
		start_gateway lanekeeper-priced "$WORK/lanes-priced.json"
		LK_PRICED_URL=http://$GW/v1/chat/completions
	fi
	GW_PID=$lk_pid GW=$lk_url

	# nginx: one limit_req zone keyed by the lane header, LANE_RPS per lane with
	# a burst of one second (nodelay: a token bucket); unknown lanes get 400.
	local nginx_port nginx_tls_port nginx_key_port lanes_re tls_server='' key_server='' key_map=''
	nginx_port=$(free_port)
	nginx_tls_port=$(free_port)
	nginx_key_port=$(free_port)
	if [ "$APIKEY" = 1 ]; then
		# The same server checking the key: a map of the keys' headers (a
		# hash lookup), 401 for a missing or unknown key.
		key_map="map \$http_authorization \$known_key {
        default 0;
        include $WORK/nginx-keys.map;
    }"
		key_server="server {
        listen 127.0.0.1:$nginx_key_port;
        keepalive_requests 1000000;
        location / {
            if (\$known_key = 0) { return 401; }
            if (\$known_lane = 0) { return 400; }
            limit_req zone=lanes burst=$LANE_RPS nodelay;
            proxy_pass http://fake_model;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
    }"
	fi
	if [ "$TLS" = 1 ]; then
		# The same server terminating TLS (TLS 1.2 and 1.3, as lanekeeper).
		tls_server="server {
        listen 127.0.0.1:$nginx_tls_port ssl;
        ssl_certificate $WORK/tls/server.crt;
        ssl_certificate_key $WORK/tls/server.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        keepalive_requests 1000000;
        location / {
            if (\$known_lane = 0) { return 400; }
            limit_req zone=lanes burst=$LANE_RPS nodelay;
            proxy_pass http://fake_model;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
    }"
	fi
	lanes_re=$(
		IFS='|'
		echo "${LANES[*]}"
	)
	mkdir -p "$WORK/nginx"
	cat >"$WORK/nginx/nginx.conf" <<EOF
worker_processes $PROXY_THREADS;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/nginx/body;
    proxy_temp_path $WORK/nginx/proxy;
    fastcgi_temp_path $WORK/nginx/fastcgi;
    uwsgi_temp_path $WORK/nginx/uwsgi;
    scgi_temp_path $WORK/nginx/scgi;
    map_hash_bucket_size 128;
    map \$http_x_lanekeeper_lane \$known_lane { ~^($lanes_re)\$ 1; default 0; }
    $key_map
    limit_req_zone \$http_x_lanekeeper_lane zone=lanes:10m rate=${LANE_RPS}r/s;
    limit_req_status 429;
    upstream fake_model { server $FAKE; keepalive 128; }
    server {
        listen 127.0.0.1:$nginx_port;
        keepalive_requests 1000000;
        location / {
            if (\$known_lane = 0) { return 400; }
            limit_req zone=lanes burst=$LANE_RPS nodelay;
            proxy_pass http://fake_model;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
    $tls_server
    $key_server
}
EOF
	start nginx "${ON_PROXY[@]}" "$NGINX" -e "$WORK/nginx/error.log" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -g 'daemon off;'
	GROUP[nginx]=$LAST_PID GROUP[nginx-tls]=$LAST_PID GROUP[nginx-apikey]=$LAST_PID
	wait_port nginx "$nginx_port"
	NGINX_URL=http://127.0.0.1:$nginx_port
	NGINX_TLS_URL=https://127.0.0.1:$nginx_tls_port
	[ "$TLS" = 1 ] && wait_port nginx "$nginx_tls_port"
	NGINX_KEY_URL=http://127.0.0.1:$nginx_key_port
	[ "$APIKEY" = 1 ] && wait_port nginx "$nginx_key_port"

	# LiteLLM: one model group per lane (the body's "model" is the lane), one
	# deployment each with an rpm limit, enforced by usage-based-routing-v2's
	# pre-call check per minute window in each worker's memory (no database, no
	# Redis): LANE_RPS * 60 / PROXY_THREADS rpm per lane and worker.
	# It refuses to start without a master key: a random one, sent by every
	# client to every path (the others ignore it).
	local litellm_port rpm lane
	[ "$LITELLM" = 1 ] || {
		latency_run
		return
	}
	litellm_port=$(free_port)
	LITELLM_KEY=sk-$(python3 -c 'import secrets; print(secrets.token_hex(24))')
	rpm=$((LANE_RPS * 60 / PROXY_THREADS))
	{
		echo "model_list:"
		for lane in "${LANES[@]}"; do
			cat <<EOF
  - model_name: $lane
    litellm_params:
      model: openai/fake-model
      api_base: http://$FAKE/v1
      api_key: not-needed
      rpm: $rpm
EOF
		done
		cat <<EOF
router_settings:
  routing_strategy: usage-based-routing-v2
litellm_settings:
  set_verbose: false
  drop_params: true
  num_retries: 0
  request_timeout: 60
general_settings:
  master_key: $LITELLM_KEY
  disable_spend_logs: true
  disable_error_logs: true
EOF
	} >"$WORK/litellm.yaml"
	# The model cost map from the package, not fetched; no telemetry.
	start litellm "${ON_PROXY[@]}" env LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOG=ERROR \
		"$LITELLM_VENV/bin/litellm" --config "$WORK/litellm.yaml" \
		--host 127.0.0.1 --port "$litellm_port" --num_workers "$PROXY_THREADS" \
		--timeout_worker_healthcheck 600 --telemetry False
	GROUP[litellm]=$LAST_PID GROUP[litellm-own]=$LAST_PID
	wait_http litellm "http://127.0.0.1:$litellm_port/health/liveliness" 1500
	LITELLM_URL=http://127.0.0.1:$litellm_port
	latency_run
}

# The rounds of (a) and (b) over every path started by latency.
latency_run() {
	local -A URLS=(
		[direct]="http://$FAKE/v1/chat/completions"
		[lanekeeper]="http://$GW/v1/chat/completions"
		[nginx]="$NGINX_URL/v1/chat/completions"
	)
	URLS[bare]=$BARE_URL
	local targets=(direct bare lanekeeper) target
	if [ -n "$BASELINE" ]; then
		URLS[lanekeeper-baseline]=$BASELINE_URL
		targets+=(lanekeeper-baseline)
	fi
	if [ "$MIMALLOC" = 1 ]; then
		URLS[lanekeeper-mimalloc]=$MIMALLOC_URL
		targets+=(lanekeeper-mimalloc)
	fi
	targets+=(nginx)
	if [ "$TLS" = 1 ]; then
		URLS[lanekeeper-tls]=$LK_TLS_URL
		URLS[nginx-tls]="$NGINX_TLS_URL/v1/chat/completions"
		targets+=(lanekeeper-tls nginx-tls)
	fi
	if [ "$SHARED" = 1 ]; then
		URLS[lanekeeper-shared]=$LK_SHARED_URL
		targets+=(lanekeeper-shared)
	fi
	if [ "$PRICED" = 1 ]; then
		URLS[lanekeeper-priced]=$LK_PRICED_URL
		targets+=(lanekeeper-priced)
	fi
	if [ "$APIKEY" = 1 ]; then
		URLS[lanekeeper-apikey]=$LK_APIKEY_URL
		URLS[nginx-apikey]="$NGINX_KEY_URL/v1/chat/completions"
		targets+=(lanekeeper-apikey nginx-apikey)
		# A request without the key is refused by both.
		for target in lanekeeper-apikey nginx-apikey; do
			[ "$(curl -sS -o /dev/null -w '%{http_code}' -H 'content-type: application/json' \
				-H 'x-lanekeeper-lane: p1-agent-assist' -H 'authorization: Bearer sk-not-a-key' \
				-d '{"model":"m","messages":[]}' "${URLS[$target]}")" = 401 ] || {
				echo "$target does not refuse an unknown key with 401" >&2
				exit 1
			}
		done
	fi
	if [ "$LITELLM" = 1 ]; then
		URLS[litellm]="$LITELLM_URL/v1/chat/completions"
		targets+=(litellm)
	fi
	# Every path answers before measuring (and the lanes are known).
	for target in "${targets[@]}"; do
		curl -fsS -o /dev/null ${TLS_ARGS[@]:+--cacert "$WORK/tls/ca.crt"} -H 'content-type: application/json' -H 'x-lanekeeper-lane: p1-agent-assist' \
			-H "authorization: Bearer $(key_for "$target")" \
			-d '{"model":"p1-agent-assist","messages":[{"role":"user","content":"Say ok."}]}' "${URLS[$target]}" || {
			echo "$target does not answer a chat completion:" >&2
			tail -n 30 "$WORK/${target/direct/fake-model}.log" >&2 || true
			exit 1
		}
	done
	machine
	log "proxies: $PROXY_THREADS thread(s) or worker(s) each; $PLACEMENT"
	log "gateway RSS before load: $(rss_kib "$GW_PID") KiB"

	local results=$WORK/results.jsonl round mode
	: >"$results"
	for round in $(seq 1 "$ROUNDS"); do
		for mode in rate max; do
			for target in "${targets[@]}"; do
				log "round $round: $mode, $target"
				if [ "$mode" = rate ] && [ "$target" = lanekeeper-shared ]; then
					# The store's commands over the run (warm-up included).
					local before after
					before=$(store_commands)
					load rate "${URLS[$target]}" "$target" "$round" --rate "$RATE"
					after=$(store_commands)
					jq -nc --argjson n "$((after - before))" --argjson s "$((DURATION + WARMUP))" --argjson r "$round" \
						'{target: "store", mode: "ops", round: $r, ops_per_s: ($n / $s)}' | tee -a "$results" >&2
				elif [ "$mode" = rate ]; then
					load rate "${URLS[$target]}" "$target" "$round" --rate "$RATE"
				else
					load max "${URLS[$target]}" "$target" "$round"
				fi
			done
		done
	done
	# LiteLLM below its own maximum too, if it could not keep up with RATE.
	local litellm_max litellm_rate
	litellm_max=$(jq -s '[.[] | select(.target == "litellm" and .mode == "max") | .rate] | sort | .[length / 2 | floor]' "$results")
	if [ "$LITELLM" = 1 ] && jq -e --argjson m "$litellm_max" --argjson r "$RATE" -n '$m < 0.95 * $r' >/dev/null; then
		litellm_rate=$(jq -n --argjson m "$litellm_max" '[$m * 0.8 | floor, 1] | max')
		for round in $(seq 1 "$ROUNDS"); do
			log "round $round: LiteLLM at 80 % of its own maximum, $litellm_rate req/s"
			load rate "${URLS[litellm]}" litellm-own "$round" --rate "$litellm_rate"
		done
	fi
	machine
	log "gateway RSS after load: $(rss_kib "$GW_PID") KiB (peak $(hwm_kib "$GW_PID") KiB)"
	stop_all

	table "$results"
}

# The key a target's requests carry: the bench key for the API-key cases,
# LiteLLM's master key (or "none") for the others, which ignore it.
key_for() {
	case $1 in
	*-apikey) echo "$API_KEY" ;;
	*) echo "${LITELLM_KEY:-none}" ;;
	esac
}

# load MODE URL TARGET ROUND [FLAG...]: one case of the load generator (on
# the load's CPUs), its JSON line appended to $results with the target and
# the round.
load() {
	local mode=$1 url=$2 target=$3 round=$4
	shift 4
	local group=${GROUP[$target]:-} before=(0 0) after=(0 0)
	[ -n "$group" ] && read -r -a before <<<"$(group_cpu "$group")"
	"${ON_LOAD[@]}" "$GEN" "$mode" --url "$url" --header "authorization: Bearer $(key_for "$target")" "${TLS_ARGS[@]}" \
		--tenants "$TENANTS" --connections "$CONNECTIONS" --duration "$DURATION" --warmup "$WARMUP" "$@" >"$WORK/load.json"
	[ -n "$group" ] && read -r -a after <<<"$(group_cpu "$group")"
	# The proxy's CPU per answer, warm-up included (the ticks cover it):
	# every answer of the run, whatever its status, less failed connections.
	jq -c --arg t "$target" --argjson r "$round" --arg g "$group" --argjson hz "$CLK_TCK" \
		--argjson u "$((after[0] - before[0]))" --argjson s "$((after[1] - before[1]))" '
		([.results | to_entries[] | select(.key != "connect-error") | .value] | add // 0) as $n
		| . + {target: $t, round: $r}
		+ (if $g == "" or $n == 0 then {} else
			{cpu_user_us: ($u / $hz * 1e6 / $n), cpu_sys_us: ($s / $hz * 1e6 / $n)} end)' \
		"$WORK/load.json" | tee -a "$results" >&2
}

# The medians over the rounds, and the added latency (a percentile through a
# proxy minus the same percentile direct, in the same round); each round's
# figures; the ratios to nginx; the noise the added p99 sits in (how far the
# direct path's own p99 moved between rounds, against the gap between
# lanekeeper's and nginx's added p99); what each proxy does per request.
table() {
	jq -rs --argjson rate "$RATE" --argjson conns "$CONNECTIONS" --arg litellm "$LITELLM_INSTALLED" \
		--arg threads "$PROXY_THREADS" --arg placement "$PLACEMENT" --arg tenants "$TENANTS" \
		--arg store "${STORE_VERSION:-}" '
		def median: map(select(. != null)) | sort | if length == 0 then null else .[length / 2 | floor] end;
		def minus(a; b): if a == null or b == null then null else a - b end;
		def ratio(a; b): if a == null or b == null or b <= 0 then null else a / b end;
		def r(n): if . == null then "-" else (. * n | round) / n | tostring end;
		. as $all
		| ($all | map(.target) | unique) as $present
		| ["direct", "bare", "lanekeeper", "lanekeeper-baseline", "lanekeeper-priced", "lanekeeper-shared", "lanekeeper-mimalloc", "nginx", "lanekeeper-tls", "nginx-tls", "lanekeeper-apikey", "nginx-apikey", "litellm"] | map(select(. as $t | $present | index($t))) as $targets
		| ($all | map(select(.mode == "rate" and .target == "direct")) | map({key: (.round | tostring), value: .}) | from_entries) as $direct
		| def added($x; f): minus($x | f; $direct[$x.round | tostring] | f);
		def row($t):
			($all | map(select(.target == $t and .mode == "rate"))) as $r
			| ($all | map(select(.target == $t and .mode == "max"))) as $m
			| {
				target: $t,
				achieved: ($r | map(.throughput) | median),
				p50: ($r | map(.p50_ms) | median),
				p99: ($r | map(.p99_ms) | median),
				add50: ($r | map(added(.; .p50_ms)) | median),
				add99: ($r | map(added(.; .p99_ms)) | median),
				unsent: ($r | map(.unsent) | add),
				late: ($r | map(.late) | add),
				connect: ($r + $m | map(.connect_errors // 0) | add),
				errors: ($r + $m | map(.errors) | add),
				max: ($m | map(.rate) | median),
				maxp99: ($m | map(.p99_ms) | median),
				cpu: ($m | map(if .cpu_user_us == null then null else .cpu_user_us + .cpu_sys_us end) | median),
				cpuu: ($m | map(.cpu_user_us) | median),
				cpus: ($m | map(.cpu_sys_us) | median)
			};
		def in_round($t; $n; $mode): $all | map(select(.target == $t and .round == $n and .mode == $mode)) | .[0];
		($targets | map(row(.))) as $rows
		| ($rows | map({key: .target, value: .}) | from_entries) as $by
		| ($all | map(.round) | unique) as $rounds
		| ($all | map(select(.target == "direct" and .mode == "rate") | .p99_ms)) as $direct99
		| minus($direct99 | max; $direct99 | min) as $spread
		| minus($by.lanekeeper.add99; $by.nginx.add99) as $gap
		| def added99($t; $n): in_round($t; $n; "rate") | if . == null then null else added(.; .p99_ms) end;
		([$rounds[] as $n | [added99("lanekeeper"; $n), added99("nginx"; $n)]
			| select(.[0] != null and .[1] != null) | .[0] > .[1]]) as $above
		| "",
		"At \($rate) req/s open loop over \($conns) connections, and closed loop with \($conns) clients (medians of \($rounds | length) rounds; LiteLLM \($litellm)); \($threads) thread(s) or worker(s) per proxy, \($placement); every request with a unique x-request-id and one of \($tenants) tenants:",
		"",
		"| path | achieved req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | max req/s | p99 ms at max | proxy CPU µs per request at max, user + sys | unsent (rate) | late (rate) | connect errors | non-2xx or errors |",
		"|---|---|---|---|---|---|---|---|---|---|---|---|---|",
		($rows[] | "| \(.target) | \(.achieved | r(1)) | \(.p50 | r(1000)) | \(.p99 | r(1000)) | \(if .target == "direct" then "-" else (.add50 | r(1000)) end) | \(if .target == "direct" then "-" else (.add99 | r(1000)) end) | \(.max | r(1)) | \(.maxp99 | r(100)) | \(if .cpu == null then "-" else "\(.cpu | r(10)) (\(.cpuu | r(10)) + \(.cpus | r(10)))" end) | \(.unsent) | \(.late) | \(.connect) | \(.errors) |"),
		"",
		"Each round (added p50 / added p99 ms at \($rate) req/s; max req/s closed loop):",
		"",
		"| round | " + ($targets | map(select(. != "direct")) | map("\(.) added p50 / p99 | \(.) max") | join(" | ")) + " | lanekeeper / nginx added p99 | lanekeeper / nginx max |",
		"|---|" + ($targets | map(select(. != "direct")) | map("---|---") | join("|")) + "|---|---|",
		($rounds[] as $n
			| "| \($n) | "
			+ ($targets | map(select(. != "direct")) | map(. as $t
				| (in_round($t; $n; "rate")) as $x
				| "\(if $x == null then null else added($x; .p50_ms) end | r(1000)) / \(if $x == null then null else added($x; .p99_ms) end | r(1000)) | \(in_round($t; $n; "max") | .rate | r(1))")
				| join(" | "))
			+ " | \(ratio(added99("lanekeeper"; $n); added99("nginx"; $n)) | r(100)) | \(ratio(in_round("lanekeeper"; $n; "max") | .rate; in_round("nginx"; $n; "max") | .rate) | r(100)) |"),
		"",
		"medians, lanekeeper / nginx: added p99 \(ratio($by.lanekeeper.add99; $by.nginx.add99) | r(100))× (aim: at most 1), max rate \(ratio($by.lanekeeper.max; $by.nginx.max) | r(100))× (aim: at least 1); lanekeeper / litellm max rate \(ratio($by.lanekeeper.max; $by.litellm.max) | r(100))×",
		"noise: p99 direct moved \($spread | r(1000)) ms between rounds (\($direct99 | min | r(1000)) to \($direct99 | max | r(1000)) ms); added p99 of lanekeeper less that of nginx, medians: \($gap | r(1000)) ms, \(if $gap == null or ($rounds | length) < 2 then "not comparable" elif ($gap | fabs) <= $spread then "inside that spread: this run cannot tell the two tails apart" else "outside that spread" end); round by round, added p99 of lanekeeper above that of nginx in \($above | map(select(.)) | length) of \($above | length)",
		"CPU per request at max (user + sys), medians: lanekeeper / nginx \(ratio($by.lanekeeper.cpu; $by.nginx.cpu) | r(100))×, bare (the HTTP stack, no policy) / nginx \(ratio($by.bare.cpu; $by.nginx.cpu) | r(100))×, lanekeeper / bare \(ratio($by.lanekeeper.cpu; $by.bare.cpu) | r(100))×; user CPU alone: lanekeeper / nginx \(ratio($by.lanekeeper.cpuu; $by.nginx.cpuu) | r(100))×, lanekeeper / bare \(ratio($by.lanekeeper.cpuu; $by.bare.cpuu) | r(100))×",
		(if $by["lanekeeper-tls"] and $by["nginx-tls"] then
			"TLS, each terminating it, lanekeeper-tls / nginx-tls: added p99 \(ratio($by["lanekeeper-tls"].add99; $by["nginx-tls"].add99) | r(100))× (aim: at most 1), max rate \(ratio($by["lanekeeper-tls"].max; $by["nginx-tls"].max) | r(100))×; what TLS adds to p99 (TLS minus plain, ms): lanekeeper \(minus($by["lanekeeper-tls"].add99; $by.lanekeeper.add99) | r(1000)), nginx \(minus($by["nginx-tls"].add99; $by.nginx.add99) | r(1000))"
		  else empty end),
		(if $by["lanekeeper-apikey"] and $by["nginx-apikey"] then
			"API key, each checking it, lanekeeper-apikey / nginx-apikey: added p99 \(ratio($by["lanekeeper-apikey"].add99; $by["nginx-apikey"].add99) | r(100))× (aim: at most 1), max rate \(ratio($by["lanekeeper-apikey"].max; $by["nginx-apikey"].max) | r(100))×; what the key check adds to p99 (key minus plain, ms): lanekeeper \(minus($by["lanekeeper-apikey"].add99; $by.lanekeeper.add99) | r(1000)), nginx \(minus($by["nginx-apikey"].add99; $by.nginx.add99) | r(1000))"
		  else empty end),
		(if $by["lanekeeper-shared"] then
			"shared state (--shared-state, redis-server \($store) on loopback), lanekeeper-shared / lanekeeper: added p50 \($by["lanekeeper-shared"].add50 | r(1000)) against \($by.lanekeeper.add50 | r(1000)) ms, added p99 \($by["lanekeeper-shared"].add99 | r(1000)) against \($by.lanekeeper.add99 | r(1000)) ms, max rate \(ratio($by["lanekeeper-shared"].max; $by.lanekeeper.max) | r(100))×; the store at \($rate) req/s: \($all | map(select(.target == "store")) | map(.ops_per_s) | median | r(1)) operations/s (median of the rounds; every request carries a new x-request-id: one id check each)"
		  else empty end),
		(if $by["lanekeeper-priced"] then
			"tokens as the cost (every lane priced per token: each answer read for its usage and settled), lanekeeper-priced / lanekeeper: added p50 \($by["lanekeeper-priced"].add50 | r(1000)) against \($by.lanekeeper.add50 | r(1000)) ms, added p99 \($by["lanekeeper-priced"].add99 | r(1000)) against \($by.lanekeeper.add99 | r(1000)) ms, max rate \(ratio($by["lanekeeper-priced"].max; $by.lanekeeper.max) | r(100))×"
		  else empty end),
		(if $by["lanekeeper-baseline"] then
			"this build / the baseline (BASELINE): CPU per request at max \(ratio($by.lanekeeper.cpu; $by["lanekeeper-baseline"].cpu) | r(100))× (user \(ratio($by.lanekeeper.cpuu; $by["lanekeeper-baseline"].cpuu) | r(100))×), max rate \(ratio($by.lanekeeper.max; $by["lanekeeper-baseline"].max) | r(100))×, added p99 \($by.lanekeeper.add99 | r(1000)) against \($by["lanekeeper-baseline"].add99 | r(1000)) ms"
		  else empty end),
		(if $by["lanekeeper-mimalloc"] then
			"allocator, mimalloc / the system allocator (shipped): max rate \(ratio($by["lanekeeper-mimalloc"].max; $by.lanekeeper.max) | r(100))×, added p99 \($by["lanekeeper-mimalloc"].add99 | r(1000)) against \($by.lanekeeper.add99 | r(1000)) ms"
		  else empty end),
		(($all | map(select(.target == "litellm-own"))) as $o
		| if ($o | length) > 0 then
			"litellm at 80 % of its own max (\($o[0].target_rate) req/s): achieved \($o | map(.throughput) | median | r(1)), p50 \($o | map(.p50_ms) | median | r(1000)) ms, p99 \($o | map(.p99_ms) | median | r(1000)) ms"
		  else empty end),
		"",
		"What each proxy does per request:",
		"",
		"| proxy | per request |",
		"|---|---|",
		"| lanekeeper | HTTP/1 parse (hyper, axum), the body read; the lane, tenant, attempt and x-request-id headers read; under the core'"'"'s lock once: the lane looked up, its token bucket refilled and taken, the request id hashed into the lane'"'"'s memory of recent ids (retry detection) and that memory swept, the retry budget checked, the route and flags, the request counted in flight (the tenant'"'"'s fair queue is used only when the lane must queue, which these limits never make it); forwarded over a pooled keep-alive upstream connection and the answer streamed back; the lock again when it finishes; Prometheus counters and histograms by lane and tenant class |",
		"| lanekeeper-baseline | as lanekeeper, another build (BASELINE) |",
		"| lanekeeper-shared | as lanekeeper, and before the lock one call to the shared store for the request id (one Lua script: first sighting, retry or deferred); the lane'"'"'s tokens come from leases a background task tops up every 0.1 s, not from a call per request |",
		"| lanekeeper-priced | as lanekeeper, and the request sized (the body'"'"'s bytes, the lane'"'"'s P95 of output tokens) and reserved at admission; the JSON answer kept whole to read its usage, then the lock once more to settle the difference into the lane'"'"'s bucket and teach the estimator |",
		"| bare | the floor (benches/bare_proxy.rs): hyper'"'"'s HTTP/1 server and hyper-util'"'"'s pooled client on tokio, the stack lanekeeper is built on, forwarding every request to the model with no policy: hop-by-hop headers dropped, nothing else read, no metrics, no log |",
		"| nginx | HTTP/1 parse; a map of the lane header (400 to an unknown lane); limit_req, a token bucket per lane header in shared memory; proxy_pass over a keep-alive upstream connection; no access log |",
		"| lanekeeper-apikey | as lanekeeper, without --trust-lane-header: the Authorization key hashed (SHA-256) and looked up among the credentials file'"'"'s hashes (constant-time compare), the tenant and lanes taken from it, the client'"'"'s Authorization removed before forwarding |",
		"| nginx-apikey | as nginx, and a map of the whole Authorization header against the keys in clear (a hash lookup; 401 for an unknown key) |",
		"| litellm | HTTP/1 parse (uvicorn, FastAPI); the master key checked; the JSON body parsed into a chat completion; usage-based-routing-v2 picks the deployment and checks its rpm in memory; a new request built by the OpenAI client and its answer parsed and re-serialised |"
	' "$1"
}

# ---- (c): memory ----------------------------------------------------------------

memory() {
	start_fake_model mem-fake-model
	# 100 lanes (copies of INC-47's P1) at MEM_LANE_RPS with deep queues and
	# long deadlines, so that the clients' requests wait in them; the pool's
	# capacity is what the lanes claim, so no spare capacity serves them sooner.
	jq --argjson n "$MEM_LANES" --argjson r "$MEM_LANE_RPS" '
		.level = 0 | .levelName = "normal" | .inFlight = null
		| .capacityUnitsPerSecond = ($n * $r)
		| .lanes[1] as $base
		| .lanes = [range($n) as $i | $base
			| .name = "lane-\($i)" | .state = "Admitted"
			| .admittedRequestsPerSecond = $r | .admittedUnitsPerSecond = $r | .workUnitsPerRequest = 1
			| .burst = 1 | .queue = {maxDepth: 1000, ttlSeconds: 3600} | .deadlineSeconds = 3600
			| .floorUnitsPerSecond = null | .expectedServiceSeconds = null | .optionalContext = null
			| .routes = ["agent-large"]]
		| .generations.lanes = ([.lanes[].name | {key: ., value: 1}] | from_entries)
		| .contentHash = "sha256:gateway-load-memory"' \
		examples/inc-47/lanes-420.json >"$WORK/lanes-100.json"
	start_gateway mem-lanekeeper "$WORK/lanes-100.json"
	machine
	local idle
	idle=$(rss_kib "$GW_PID")
	log "memory: gateway with $MEM_LANES lanes, idle: VmRSS $idle KiB"

	"$GEN" hold --url "http://$GW/v1/chat/completions" --clients "$MEM_QUEUED" --lanes "$MEM_LANES" \
		--tenants "$MEM_TENANTS" >"$WORK/hold.json" &
	local gen=$! queued rss best_q=0 best_rss=0 max_rss=0
	while kill -0 "$gen" 2>/dev/null; do
		sleep 1
		queued=$(curl -fsS "http://$GW_METRICS/metrics" | awk '/^lanekeeper_gateway_queue_depth\{/ {s += $2} END {print s + 0}')
		rss=$(rss_kib "$GW_PID")
		[ "$rss" -gt "$max_rss" ] && max_rss=$rss
		if [ "$queued" -ge "$best_q" ]; then
			best_q=$queued
			best_rss=$rss
		fi
		echo "queued $queued VmRSS $rss KiB" >>"$WORK/memory-samples.txt"
	done
	wait "$gen"
	local after hwm
	after=$(rss_kib "$GW_PID")
	hwm=$(hwm_kib "$GW_PID")
	echo "" >&2
	jq -c . "$WORK/hold.json" >&2
	cat <<EOF

Memory of lanekeeper gateway, $MEM_LANES lanes at $MEM_LANE_RPS req/s each, $MEM_QUEUED clients waiting at once, $MEM_TENANTS tenants ($(jq .ok "$WORK/hold.json") answered, $(jq .errors "$WORK/hold.json") refused or failed, in $(jq '.window_s | round' "$WORK/hold.json") s):

| figure | VmRSS |
|---|---|
| idle, config loaded | $((idle / 1024)) MiB ($idle KiB) |
| with the most requests queued ($best_q) | $((best_rss / 1024)) MiB ($best_rss KiB) |
| highest sample during the run | $((max_rss / 1024)) MiB ($max_rss KiB) |
| after the run (all $MEM_TENANTS tenants seen) | $((after / 1024)) MiB ($after KiB) |
| peak (VmHWM) | $((hwm / 1024)) MiB ($hwm KiB) |
EOF
}

case "$WHAT" in
latency) latency ;;
memory) memory ;;
all)
	latency
	memory
	;;
esac
