#!/usr/bin/env bash
# The AWS provider's live proof (docs/aws.md, "Live proof"). Run by a user with
# an AWS account; it creates real (billed) EC2 instances and ends by proving
# that none of them is left. Steps:
#   1. a coordinator with --portable --aws-config, a portable aws pool of 2;
#   2. two independently configured clients (own directory, own token, own
#      key) borrow and ack; each reaches its machine; neither key opens the
#      other machine;
#   3. alice returns while a session of hers is open: the session ends (the
#      fence rebooted the instance), the machine comes back ready, and alice
#      reborrows it with a fresh key; her old key and her old files are gone;
#   4. bob's client is killed (no more heartbeats): his grant is invalidated,
#      the instance quarantined and terminated, and the pool refills;
#   5. ambiguous SSM completion: the coordinator is restarted with a 1.5 s
#      operation budget, so an install through SSM outlasts a call; the ack
#      answers "installing" and the grant turns active only when a retry with
#      the same operation id learns the guest's answer;
#   6. drain, then count the instances tagged for this deployment in every
#      configured region: the proof passes only at zero.
#
# Whatever happens after the first launch (a failed check, a timeout, Ctrl-C,
# SIGTERM, SIGHUP, the coordinator dying), the exit trap ends what it
# started: it ends its background processes (heartbeat loops, the open
# session of step 3), drains the pool through the coordinator if it still answers
# (bounded by BERTH_PROOF_DRAIN_TIMEOUT), stops the coordinator, then
# terminates every instance of the deployment by launch record and by tag
# (`berth aws orphans --including-live --terminate --yes`), prints what it
# ended, and fails unless zero instances remain. Only SIGKILL of the script
# itself escapes the trap: then run that orphans command by hand (the work
# directory is printed first).
#
# Usage: scripts/aws-live-proof.sh [--dry-run] [--yes] [--price-per-hour USD] AWS_CONFIG.json
#   --dry-run         print what it would launch, the instance-hour bound and
#                     (with --price-per-hour) the cost bound; launch nothing
#   --yes             do not ask before launching (needed without a terminal)
#   AWS credentials from the standard chain (AWS_PROFILE, SSO, env, role);
#   the pool named "proof" must be in the config; this machine must reach the
#   instances' SSH address (sshAddress in the config). Needs: jq, ssh, curl.
#   BERTH_PROOF_POLL (s, default 5), BERTH_PROOF_DRAIN_TIMEOUT (s, default 900),
#   BERTH_PROOF_CALL_TIMEOUT (s per berth command, default 300),
#   BERTH_PROOF_HEARTBEAT (s, the pool's borrow heartbeat, default 60; step 4
#   waits about twice that), BERTH_PROOF_SESSION_SETTLE (s the session of step
#   3 runs before the return, default 10).
#   BERTH_PROOF_PAUSE_AT=POINT (for the emulator test of the exit trap only):
#   on reaching POINT (preflight, 1 … 6: a point inside that step, see `at`)
#   print "paused at POINT" and wait until the file WORK/continue exists, so
#   that a test can signal the script, or kill its coordinator, there.
set -euo pipefail
# The script's own stdout and stderr, kept on fds 3 and 4: the exit trap can run while a
# command's output is redirected (wait_for sends its condition's output to /dev/null), and
# its report must still reach the user.
exec 3>&1 4>&2

DRY=0; YES=0; PRICE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --yes) YES=1; shift ;;
    --price-per-hour) PRICE="${2:?--price-per-hour needs a value in USD}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
CONFIG="$(realpath "${1:?usage: $0 [--dry-run] [--yes] [--price-per-hour USD] AWS_CONFIG.json}")"
BERTH="$(cd "$(dirname "$0")/.." && pwd)/bin/berth"
POOL=proof
POLL="${BERTH_PROOF_POLL:-5}"
DRAIN_TIMEOUT="${BERTH_PROOF_DRAIN_TIMEOUT:-900}"
CALL_TIMEOUT="${BERTH_PROOF_CALL_TIMEOUT:-300}"
HEARTBEAT="${BERTH_PROOF_HEARTBEAT:-60}"
SETTLE="${BERTH_PROOF_SESSION_SETTLE:-10}"
DEPLOYMENT="$(jq -r .deployment "$CONFIG")"
REGIONS="$(jq -r '[.pools[].region] | unique | .[]' "$CONFIG" | tr '\n' ' ')"
POOLCONF="$(jq -c ".pools.$POOL // .pools[\"proof/$POOL\"]" "$CONFIG")"
[ "$POOLCONF" != null ] || { echo "the config has no pool named $POOL" >&2; exit 2; }
# At most 2 ready, 1 refill after bob's machine is destroyed and 1 after alice's fenced return: 4 launches.
LAUNCHES=4
HOURS=2

plan() {
  printf 'deployment %s (tag berth:deployment) in region(s) %s\n' "$DEPLOYMENT" "$REGIONS"
  printf 'pool %s: %s\n' "$POOL" "$(jq -r '"\(.instanceType) (fallbacks: \((.fallbackInstanceTypes // []) | join(", ") | if . == "" then "none" else . end)) from \(.imageId) in \(.subnetId)"' <<<"$POOLCONF")"
  printf 'launches at most %s instances, 2 at a time; its waits time out after about %s h in all (each berth call within %ss more): about %s instance-hours if every wait runs out\n' "$LAUNCHES" "$HOURS" "$CALL_TIMEOUT" "$((2 * HOURS))"
  if [ -n "$PRICE" ]; then
    printf 'cost bound at %s USD per instance-hour: %s USD (plus EBS and data transfer)\n' "$PRICE" "$(awk -v p="$PRICE" -v h="$((2 * HOURS))" 'BEGIN { printf "%.2f", p * h }')"
  else
    printf 'cost: pass --price-per-hour USD (the on-demand price of the type in this region) for a bound\n'
  fi
}

if [ "$DRY" = 1 ]; then
  echo "dry run: nothing is launched"
  plan
  exit 0
fi

WORK="$(mktemp -d -t berth-aws-proof-XXXXXX)"
chmod 700 "$WORK"
echo "work directory (logs, receipts, the coordinator's state): $WORK"
COORD_PID=""
URL=""
# The coordinator's port, kept across its restarts: receipts name the coordinator's URL.
PORT="${BERTH_PROOF_PORT:-0}"
# Background processes of the script (heartbeat loops, the open session of step 3): the trap ends them.
BG_PIDS=()
CLEANING=0

step() { printf '\n== %s\n' "$*"; }
# A point inside a step where the emulator test of the trap stops the script (BERTH_PROOF_PAUSE_AT); a no-op otherwise.
at() { # point
  [ "${BERTH_PROOF_PAUSE_AT:-}" = "$1" ] || return 0
  echo "paused at $1"
  until [ -e "$WORK/continue" ]; do sleep 0.1; done
}
pass() { printf 'PASS %s\n' "$*"; }
fail() { printf 'FAIL %s\n' "$*" >&2; exit 1; }
wait_for() { # what, timeout seconds, command...
  # $SECONDS, not $(date): a signal trap that runs while a command substitution is parsed breaks the parse.
  local what="$1" t="$2" end; shift 2
  end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$end" ] || fail "timed out after ${t}s waiting for $what"
    # A dead coordinator answers nothing: fail now rather than at the timeout (the trap then ends the instances by record and tag).
    [ -z "$COORD_PID" ] || kill -0 "$COORD_PID" 2>/dev/null || fail "the coordinator (pid $COORD_PID) is gone while waiting for $what; see $WORK/coord.log"
    sleep "$POLL"
  done
}

b() { timeout "$CALL_TIMEOUT" "$BERTH" "$@"; }

# Instances of the deployment, by launch record and by tag, in every region the config or a record names.
orphans() { b aws orphans --aws-config "$CONFIG" --state-dir "$WORK/coord" --including-live "$@"; }
tagged_instances() { orphans --json | jq '[.instances[] | select(.state != "terminated")] | length'; }

start_coordinator() { # config file
  : >"$WORK/coord.out"
  "$BERTH" serve --portable --aws-config "$1" --state-dir "$WORK/coord" --listen "127.0.0.1:$PORT" >"$WORK/coord.out" 2>>"$WORK/coord.log" 3>&- 4>&- &
  COORD_PID=$!
  echo "$COORD_PID" >"$WORK/coord.pid"
  listening() { URL="$(sed -n 's/^berth coordinator listening on \([^ ]*\).*/\1/p' "$WORK/coord.out")"; [ -n "$URL" ] && curl -sf "$URL/v1/health"; }
  wait_for "the coordinator" 60 listening
  URL="$(sed -n 's/^berth coordinator listening on \([^ ]*\).*/\1/p' "$WORK/coord.out")"
  PORT="${URL##*:}"
  [ ! -d "$WORK/admin-cli" ] || printf '{"url":"%s","tokenFile":"token"}\n' "$URL" >"$WORK/admin-cli/client.json"
  for who in alice bob; do [ ! -d "$WORK/$who" ] || printf '{"url":"%s","tokenFile":"token"}\n' "$URL" >"$WORK/$who/client.json"; done
}

stop_coordinator() {
  [ -n "$COORD_PID" ] || return 0
  kill "$COORD_PID" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$COORD_PID" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$COORD_PID" 2>/dev/null || true
  wait "$COORD_PID" 2>/dev/null || true
  COORD_PID=""
}

# Polled over HTTP (curl), not by starting a berth process per poll.
ready() { admin_get "/v1/pools/$POOL" | jq -e '.counts.ready >= 2'; }
ready_one() { admin_get "/v1/pools/$POOL" | jq -e '.counts.ready >= 1'; }

admin_get() { curl -sf -m 30 -H @"$WORK/admin.header" "$URL$1"; }
admin_post() { # path json
  curl -sf -m 30 -X POST -H @"$WORK/admin.header" -H 'content-type: application/json' --data "$2" "$URL$1"
}

client() { # name
  mkdir -p -m 700 "$WORK/$1"
  b token create --state-dir "$WORK/coord" --org proof --role member --out "$WORK/$1/token" >/dev/null
  printf '{"url":"%s","tokenFile":"token"}\n' "$URL" >"$WORK/$1/client.json"
  chmod 600 "$WORK/$1/client.json"
}

as() { local who="$1"; shift; b "$@" --config "$WORK/$who/client.json"; }
# A command on a borrowed machine: berth ssh runs its arguments as one argv (each quoted), so a shell line goes through bash -c.
on() { # who receipt shell-line
  b ssh --receipt "$2" --config "$WORK/$1/client.json" -- bash -c "$3"
}

heartbeat_loop() { # who receipt
  while sleep "$(awk -v h="$HEARTBEAT" 'BEGIN { print h / 3 }')"; do as "$1" heartbeat --receipt "$2" >/dev/null 2>&1 || true; done 3>&- 4>&- &
  BG_PIDS+=($!)
}

drained() { admin_post "/v1/pools/$POOL/drain" '{"force":true}' | jq -e '.remaining == 0'; }
zero() { [ "$(tagged_instances)" = 0 ]; }

cleanup() {
  local rc=$? left
  [ "$CLEANING" = 0 ] || return 0
  CLEANING=1
  trap '' INT TERM HUP
  exec 1>&3 2>&4
  set +e
  for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  if [ -n "$COORD_PID" ] && kill -0 "$COORD_PID" 2>/dev/null && [ -f "$WORK/admin.header" ]; then
    echo "cleanup: draining pool $POOL through the coordinator (up to ${DRAIN_TIMEOUT}s)"
    as admin-cli pool ensure "$POOL" --min-ready 0 --max-ready 2 --compatibility-key aws-linux --access portable --provider aws >/dev/null 2>&1
    (wait_for "the drain" "$DRAIN_TIMEOUT" drained) || echo "cleanup: the drain did not finish; terminating by record and tag"
  fi
  stop_coordinator
  if [ -d "$WORK/coord" ]; then
    echo "cleanup: terminating every instance of deployment $DEPLOYMENT by launch record and by tag"
    orphans --terminate --yes --json >"$WORK/cleanup.json" 2>>"$WORK/cleanup.log"
    jq -r '(.ended.terminated // [])[] | "cleanup: terminated \(.)"' "$WORK/cleanup.json" 2>/dev/null
    (wait_for "zero instances" "$DRAIN_TIMEOUT" zero)
    left="$(tagged_instances 2>>"$WORK/cleanup.log")"
    if [ "$left" = 0 ]; then
      echo "cleanup: 0 instances of deployment $DEPLOYMENT remain"
    else
      echo "cleanup: ${left:-an unknown number of} INSTANCES OF DEPLOYMENT $DEPLOYMENT REMAIN; end them with:" >&2
      echo "  $BERTH aws orphans --aws-config $CONFIG --state-dir $WORK/coord --including-live --terminate --yes" >&2
      [ "$rc" != 0 ] || rc=1
    fi
  fi
  echo "work directory (logs, receipts): $WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

step "preflight"
plan
if [ "$YES" != 1 ] && [ ! -t 0 ]; then
  echo "launching billed instances needs confirmation: run on a terminal or pass --yes" >&2
  CLEANING=1
  exit 2
fi
mkdir -p -m 700 "$WORK/coord"
start_coordinator "$CONFIG"
orphans --json >"$WORK/preflight.json" || [ $? = 1 ] || fail "cannot list the deployment's instances (credentials? endpoint?); see above"
[ "$(jq '.instances | length' "$WORK/preflight.json")" = 0 ] || fail "instances tagged berth:deployment=$DEPLOYMENT already exist; use a fresh deployment name"
pass "credentials from the default chain answer; no instance of deployment $DEPLOYMENT yet"
at preflight
if [ "$YES" != 1 ]; then
  read -r -p "launch these instances? [y/N] " answer
  [[ "$answer" =~ ^[Yy]([Ee][Ss])?$ ]] || { echo "nothing launched"; exit 1; }
fi

step "1. coordinator and a portable aws pool of 2"
b token create --state-dir "$WORK/coord" --org proof --role admin --out "$WORK/admin.token" >/dev/null
printf 'authorization: Bearer %s\n' "$(cat "$WORK/admin.token")" >"$WORK/admin.header"; chmod 600 "$WORK/admin.header"
client admin-cli; cp "$WORK/admin.token" "$WORK/admin-cli/token"
as admin-cli pool ensure "$POOL" --min-ready 2 --max-ready 2 --compatibility-key aws-linux --access portable --provider aws --heartbeat "${HEARTBEAT}s"
at 1
wait_for "2 ready instances" 900 ready
pass "2 instances provisioned, enrolled over SSM and ready"

step "2. two independently configured clients, no shared key"
client alice; client bob
as alice borrow "$POOL" --access portable --receipt "$WORK/alice/r1.json"
as bob borrow "$POOL" --access portable --receipt "$WORK/bob/r1.json"
heartbeat_loop alice "$WORK/alice/r1.json"; ALICE_HB=$!
heartbeat_loop bob "$WORK/bob/r1.json"; BOB_HB=$!
as alice ack --receipt "$WORK/alice/r1.json"
as bob ack --receipt "$WORK/bob/r1.json"
at 2
[ "$(on alice "$WORK/alice/r1.json" 'echo alice > ~/note; echo usable')" = usable ] || fail "alice cannot use her machine"
[ "$(on bob "$WORK/bob/r1.json" 'echo usable')" = usable ] || fail "bob cannot use his machine"
BOB_HOST="$(jq -r .machine.ssh.host "$WORK/bob/r1.json")"; BOB_USER="$(jq -r .machine.ssh.user "$WORK/bob/r1.json")"; BOB_PORT="$(jq -r .machine.ssh.port "$WORK/bob/r1.json")"
if timeout 60 ssh -i "$(jq -r .keyFile "$WORK/alice/r1.json")" -p "$BOB_PORT" -o BatchMode=yes -o ConnectTimeout=20 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes "$BOB_USER@$BOB_HOST" true 2>/dev/null; then
  fail "alice's key opened bob's machine"
fi
pass "usable access for both; alice's key is refused on bob's machine"

step "3. return with an open session (fenced), reborrow"
timeout 900 "$BERTH" ssh --receipt "$WORK/alice/r1.json" --config "$WORK/alice/client.json" -- sleep 3600 &
OPEN=$!
BG_PIDS+=("$OPEN")
sleep "$SETTLE"
at 3
kill "$ALICE_HB"
as alice return --receipt "$WORK/alice/r1.json"
set +e; wait "$OPEN"; OPEN_RC=$?; set -e
[ "$OPEN_RC" != 0 ] || fail "the open session finished normally; it should have been cut"
[ "$OPEN_RC" != 124 ] || fail "the open session was still open 900 s later; the fence did not cut it"
pass "the session open at return was ended (exit $OPEN_RC)"
wait_for "alice's machine ready again (key removed, reboot observed, scrubbed)" 900 ready_one
as alice borrow "$POOL" --access portable --receipt "$WORK/alice/r2.json"
heartbeat_loop alice "$WORK/alice/r2.json"
as alice ack --receipt "$WORK/alice/r2.json"
[ "$(on alice "$WORK/alice/r2.json" 'ls ~ | grep -c note; true')" = 0 ] || fail "the previous borrow's files survived"
pass "reborrowed with a fresh key; nothing of the previous borrow is left"

step "4. a killed borrower"
kill -9 "$BOB_HB"
at 4
BOB_BORROW="$(jq -r .borrowId "$WORK/bob/r1.json")"
bob_gone() { admin_get "/v1/borrows/$BOB_BORROW" | jq -e '.reason == "heartbeat_missed" and (.machine.state == "destroyed" or .machine.state == "pruned")'; }
wait_for "bob's machine quarantined and destroyed" 900 bob_gone
if on bob "$WORK/bob/r1.json" true 2>/dev/null; then fail "bob's key still works"; fi
pass "bob's grant invalidated (heartbeat missed), instance terminated"

step "5. ambiguous SSM completion"
jq '.stepBudgetMs = 1500' "$CONFIG" >"$WORK/short-budget.json"
stop_coordinator
start_coordinator "$WORK/short-budget.json"
wait_for "a ready machine" 900 ready_one
as alice return --receipt "$WORK/alice/r2.json" || true
as alice borrow "$POOL" --access portable --receipt "$WORK/alice/r3.json"
heartbeat_loop alice "$WORK/alice/r3.json"
if FIRST="$(as alice ack --receipt "$WORK/alice/r3.json" 2>&1)"; then
  fail "the first ack was already active: the install did not outlast one call (nothing ambiguous was proven)"
fi
grep -q "is installing after acknowledgement" <<<"$FIRST" || fail "the first ack failed otherwise: $FIRST"
at 5
active() { as alice ack --receipt "$WORK/alice/r3.json"; }
wait_for "the retried install to be proven" 300 active
[ "$(on alice "$WORK/alice/r3.json" 'echo usable')" = usable ] || fail "no access after the ambiguous install"
pass "the install outlasted one call (first ack: installing), was retried by the same op id and proven"
# The short budget was for this step only.
stop_coordinator
start_coordinator "$CONFIG"

step "6. drain and prove zero remaining instances"
as alice return --receipt "$WORK/alice/r3.json" || true
as admin-cli pool ensure "$POOL" --min-ready 0 --max-ready 2 --compatibility-key aws-linux --access portable --provider aws
at 6
wait_for "every machine destroyed" 900 drained
stop_coordinator
wait_for "zero tagged instances" 600 zero
pass "zero instances of deployment $DEPLOYMENT remain, by record and by tag, in: $REGIONS"
echo "LIVE PROOF PASSED"
