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
# Usage: scripts/aws-live-proof.sh AWS_CONFIG.json
#   AWS credentials from the standard chain (AWS_PROFILE, SSO, env, role);
#   the pool named "proof" must be in the config; this machine must reach the
#   instances' SSH address (sshAddress in the config). Needs: aws, jq, ssh, curl.
set -euo pipefail

CONFIG="$(realpath "${1:?usage: $0 AWS_CONFIG.json}")"
BERTH="$(cd "$(dirname "$0")/.." && pwd)/bin/berth"
POOL=proof
PORT="${BERTH_PROOF_PORT:-7431}"
WORK="$(mktemp -d -t berth-aws-proof-XXXXXX)"
chmod 700 "$WORK"
DEPLOYMENT="$(jq -r .deployment "$CONFIG")"
REGIONS="$(jq -r '[.pools[].region] | unique | .[]' "$CONFIG")"
COORD_PID=""
HB_PIDS=()

step() { printf '\n== %s\n' "$*"; }
pass() { printf 'PASS %s\n' "$*"; }
fail() { printf 'FAIL %s\n' "$*" >&2; exit 1; }
wait_for() { # what, timeout seconds, command...
  local what="$1" t="$2"; shift 2
  for ((i = 0; i < t; i += 5)); do "$@" >/dev/null 2>&1 && return 0; sleep 5; done
  fail "timed out after ${t}s waiting for $what"
}

tagged_instances() {
  local n=0 r c
  for r in $REGIONS; do
    c="$(aws ec2 describe-instances --region "$r" \
      --filters "Name=tag:berth:deployment,Values=$DEPLOYMENT" "Name=instance-state-name,Values=pending,running,stopping,stopped,shutting-down" \
      --query 'length(Reservations[].Instances[])' --output text)"
    n=$((n + c))
  done
  echo "$n"
}

start_coordinator() { # config file
  "$BERTH" serve --portable --aws-config "$1" --state-dir "$WORK/coord" --listen "127.0.0.1:$PORT" >>"$WORK/coord.log" 2>&1 &
  COORD_PID=$!
  wait_for "the coordinator" 60 curl -sf "http://127.0.0.1:$PORT/v1/health"
}

stop_coordinator() { [ -n "$COORD_PID" ] && kill "$COORD_PID" 2>/dev/null && wait "$COORD_PID" 2>/dev/null || true; COORD_PID=""; }

ready() { as admin-cli pool show "$POOL" --json | jq -e '.counts.ready >= 2'; }
ready_one() { as admin-cli pool show "$POOL" --json | jq -e '.counts.ready >= 1'; }

admin_get() { curl -sf -H @"$WORK/admin.header" "http://127.0.0.1:$PORT$1"; }
admin_post() { # path json
  curl -sf -X POST -H @"$WORK/admin.header" -H 'content-type: application/json' --data "$2" "http://127.0.0.1:$PORT$1"
}

client() { # name
  mkdir -p -m 700 "$WORK/$1"
  "$BERTH" token create --state-dir "$WORK/coord" --org proof --role member --out "$WORK/$1/token" >/dev/null
  printf '{"url":"http://127.0.0.1:%s","tokenFile":"token"}\n' "$PORT" >"$WORK/$1/client.json"
  chmod 600 "$WORK/$1/client.json"
}

as() { local who="$1"; shift; "$BERTH" "$@" --config "$WORK/$who/client.json"; }

heartbeat_loop() { # who receipt
  while sleep 20; do as "$1" heartbeat --receipt "$2" >/dev/null 2>&1 || true; done &
  HB_PIDS+=($!)
}

cleanup() {
  for p in "${HB_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  stop_coordinator
  echo "work directory (logs, receipts): $WORK"
}
trap cleanup EXIT

step "preflight"
aws sts get-caller-identity --query Arn --output text
jq -e ".pools.$POOL // .pools[\"proof/$POOL\"]" "$CONFIG" >/dev/null || fail "the config has no pool named $POOL"
[ "$(tagged_instances)" = 0 ] || fail "instances tagged berth:deployment=$DEPLOYMENT already exist; use a fresh deployment name"
pass "credentials from the default chain; no instance of deployment $DEPLOYMENT yet"

step "1. coordinator and a portable aws pool of 2"
mkdir -p -m 700 "$WORK/coord"
start_coordinator "$CONFIG"
"$BERTH" token create --state-dir "$WORK/coord" --org proof --role admin --out "$WORK/admin.token" >/dev/null
printf 'authorization: Bearer %s\n' "$(cat "$WORK/admin.token")" >"$WORK/admin.header"; chmod 600 "$WORK/admin.header"
client admin-cli; cp "$WORK/admin.token" "$WORK/admin-cli/token"
as admin-cli pool ensure "$POOL" --min-ready 2 --max-ready 2 --compatibility-key aws-linux --access portable --provider aws
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
[ "$(as alice ssh --receipt "$WORK/alice/r1.json" -- 'echo alice > ~/note; echo usable')" = usable ] || fail "alice cannot use her machine"
[ "$(as bob ssh --receipt "$WORK/bob/r1.json" -- echo usable)" = usable ] || fail "bob cannot use his machine"
BOB_HOST="$(jq -r .machine.ssh.host "$WORK/bob/r1.json")"; BOB_USER="$(jq -r .machine.ssh.user "$WORK/bob/r1.json")"
if ssh -i "$(jq -r .keyFile "$WORK/alice/r1.json")" -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes "$BOB_USER@$BOB_HOST" true 2>/dev/null; then
  fail "alice's key opened bob's machine"
fi
pass "usable access for both; alice's key is refused on bob's machine"

step "3. return with an open session (fenced), reborrow"
as alice ssh --receipt "$WORK/alice/r1.json" -- 'sleep 3600' &
OPEN=$!
sleep 10
kill "$ALICE_HB"
as alice return --receipt "$WORK/alice/r1.json"
wait "$OPEN" && fail "the open session finished normally; it should have been cut" || true
pass "the session open at return was ended"
wait_for "alice's machine ready again (key removed, reboot observed, scrubbed)" 900 ready_one
as alice borrow "$POOL" --access portable --receipt "$WORK/alice/r2.json"
heartbeat_loop alice "$WORK/alice/r2.json"
as alice ack --receipt "$WORK/alice/r2.json"
[ "$(as alice ssh --receipt "$WORK/alice/r2.json" -- 'ls ~ | grep -c note; true')" = 0 ] || fail "the previous borrow's files survived"
pass "reborrowed with a fresh key; nothing of the previous borrow is left"

step "4. a killed borrower"
kill -9 "$BOB_HB"
BOB_BORROW="$(jq -r .borrowId "$WORK/bob/r1.json")"
bob_gone() { admin_get "/v1/borrows/$BOB_BORROW" | jq -e '.reason == "heartbeat_missed" and (.machine.state == "destroyed" or .machine.state == "pruned")'; }
wait_for "bob's machine quarantined and destroyed" 900 bob_gone
if as bob ssh --receipt "$WORK/bob/r1.json" -- true 2>/dev/null; then fail "bob's key still works"; fi
pass "bob's grant invalidated (heartbeat missed), instance terminated"

step "5. ambiguous SSM completion"
jq '.stepBudgetMs = 1500' "$CONFIG" >"$WORK/short-budget.json"
stop_coordinator
start_coordinator "$WORK/short-budget.json"
wait_for "a ready machine" 900 ready_one
as alice return --receipt "$WORK/alice/r2.json" || true
as alice borrow "$POOL" --access portable --receipt "$WORK/alice/r3.json"
heartbeat_loop alice "$WORK/alice/r3.json"
as alice ack --receipt "$WORK/alice/r3.json" | tee "$WORK/ack3.txt"
active() { as alice ack --receipt "$WORK/alice/r3.json" | grep -q ACTIVE; }
wait_for "the retried install to be proven" 300 active
[ "$(as alice ssh --receipt "$WORK/alice/r3.json" -- echo usable)" = usable ] || fail "no access after the ambiguous install"
pass "the install outlasted one call, was retried by the same op id and proven"

step "6. drain and prove zero remaining instances"
as alice return --receipt "$WORK/alice/r3.json" || true
as admin-cli pool ensure "$POOL" --min-ready 0 --max-ready 2 --compatibility-key aws-linux --access portable --provider aws
drained() { admin_post "/v1/pools/$POOL/drain" '{"force":true}' | jq -e '.remaining == 0'; }
wait_for "every machine destroyed" 900 drained
zero() { [ "$(tagged_instances)" = 0 ]; }
wait_for "zero tagged instances" 600 zero
pass "zero instances tagged berth:deployment=$DEPLOYMENT remain in: $REGIONS"
echo "LIVE PROOF PASSED"
