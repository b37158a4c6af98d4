/**
 * The guest contract: the bash programs berth runs on an instance through
 * SSM (AWS-RunShellScript). Every program
 *
 *   1. takes the guest lock (flock), so two deliveries of one command, or a
 *      delayed command and a fresh one, never interleave;
 *   2. checks it runs on the exact instance it was sent to (cloud-init's
 *      instance id) and, after enrollment, that the instance is still bound
 *      to the same berth machine and pool;
 *   3. answers a finished operation id again from its record instead of
 *      acting twice (a lost SSM reply, a duplicated delivery);
 *   4. checks the generation BEFORE it mutates: work for a generation older
 *      than the guest's current one, or for a generation whose keys were
 *      already removed ("sealed"), changes nothing and is refused. So delayed
 *      SSM work of an older borrow can never install or restore a key.
 *
 * Keys live in a root-owned file per machine user (/etc/berth/keys/<user>,
 * named by sshd's AuthorizedKeysFile for that user only), so a borrower
 * cannot add keys of its own. A grant key carries OpenSSH's expiry-time
 * option and, installed BEFORE the key is written, a systemd timer that at
 * the grant's expiry removes the key and kills the user's processes: the
 * guest itself ends access at the hard deadline, whatever the coordinator
 * does. The install reads the key file back (the grant's one line must be
 * the line written) and reports that line; enrollment fails unless sshd
 * reloads and `sshd -T` shows it reads /etc/berth/keys/%u for the user.
 * Output is one line `BERTH-RESULT <json>` or `BERTH-REFUSED <code>
 * <message>` (exit 3: the step did not take effect; a refused install
 * leaves no key of its grant).
 *
 * `BERTH_GUEST_ROOT` (unset on a real instance) prefixes every path; the EC2
 * emulator sets it to the instance's sandbox directory.
 */
import { parsePublicKey } from "../../core/ssh-public-key.js";

export type GuestStep =
  | { kind: "enroll"; keeperKey: string | null }
  | { kind: "install_key"; publicKey: string; grantId: string; expiresAt: number }
  | { kind: "remove_key"; grantId: string | null }
  | { kind: "fence_prepare" }
  | { kind: "boot_id" }
  | { kind: "scrub" };

export interface GuestTarget {
  opId: string;
  instanceId: string;
  machineId: string;
  pool: string;
  generation: number;
}

const SAFE = /^[A-Za-z0-9_.:-]{1,128}$/;

function q(v: string): string {
  if (!SAFE.test(v)) throw new Error(`unsafe guest value ${JSON.stringify(v.slice(0, 40))}`);
  return `'${v}'`;
}

function keyB64(line: string): string {
  return Buffer.from(parsePublicKey(line).line, "utf8").toString("base64");
}

const PRELUDE = String.raw`set -euo pipefail
umask 022
R="$(printenv BERTH_GUEST_ROOT || true)"
S="$R/var/lib/berth"
K="$R/etc/berth/keys/$MACHINE"
mkdir -p "$S/ops"
chmod 700 "$S"
exec 9>"$S/lock"
flock 9
result() { printf 'BERTH-RESULT %s\n' "$1"; }
refuse() { printf 'BERTH-REFUSED %s %s\n' "$1" "$2"; exit 3; }
done_with() { printf '%s' "$1" > "$S/ops/$OP.tmp"; mv "$S/ops/$OP.tmp" "$S/ops/$OP.done"; result "$1"; }
have="$(cat "$R/var/lib/cloud/data/instance-id" 2>/dev/null || true)"
[ "$have" = "$INSTANCE" ] || refuse wrong_instance "this guest is '$have', not $INSTANCE"
if [ -f "$S/ops/$OP.done" ]; then result "$(cat "$S/ops/$OP.done")"; exit 0; fi
boot() { cat "$R/proc/sys/kernel/random/boot_id"; }
cur="$(cat "$S/generation" 2>/dev/null || echo 0)"
sealed="$(cat "$S/sealed" 2>/dev/null || echo -1)"
bound() { [ "$(cat "$S/binding" 2>/dev/null || true)" = "$MACHINE $POOL" ] || refuse wrong_machine "this guest is not bound to machine $MACHINE of pool $POOL"; }
at_generation() {
  [ "$GEN" -ge "$cur" ] || refuse generation_mismatch "operation for generation $GEN, the guest is at generation $cur"
  if [ "$GEN" -gt "$cur" ]; then drop_grant_keys; echo "$GEN" > "$S/generation"; cur="$GEN"; fi
}
keys_without() { # $1: a grep -E pattern of key comments to drop
  touch "$K"
  grep -Ev "$1" "$K" > "$K.tmp" || true
  chmod 644 "$K.tmp"; mv "$K.tmp" "$K"
}
stop_timers() { for u in $(cat "$S/timers" 2>/dev/null || true); do systemctl stop "$u.timer" >/dev/null 2>&1 || true; done; : > "$S/timers"; : > "$S/expiries"; }
drop_grant_keys() { keys_without ' berth:g[0-9]+:'; stop_timers; }
count_keys() { touch "$K"; grep -c ' berth:' "$K" || true; }
`;

const STEPS: Record<GuestStep["kind"], string> = {
  enroll: String.raw`
if [ -f "$S/binding" ]; then bound; fi
echo "$MACHINE $POOL" > "$S/binding"
[ -f "$S/generation" ] || echo 0 > "$S/generation"
id -u "$MACHINE" >/dev/null 2>&1 || useradd -m -s /bin/bash "$MACHINE"
mkdir -p "$R/etc/berth/keys" "$R/etc/ssh/sshd_config.d" "$R/usr/local/libexec"
chmod 755 "$R/etc/berth" "$R/etc/berth/keys"
touch "$K"; chmod 644 "$K"
printf 'Match User %s\n    AuthorizedKeysFile /etc/berth/keys/%%u\n' "$MACHINE" > "$R/etc/ssh/sshd_config.d/50-berth-$MACHINE.conf"
cat > "$R/usr/local/libexec/berth-expire" <<'EOF'
#!/bin/bash
# berth guest-side expiry: remove the grant keys of generation $2 for user $1, then end the user's processes.
R="$(printenv BERTH_GUEST_ROOT || true)"
K="$R/etc/berth/keys/$1"
grep -Ev " berth:g$2:" "$K" > "$K.tmp" || true
chmod 644 "$K.tmp"; mv "$K.tmp" "$K"
pkill -KILL -u "$1" || true
EOF
cat > "$R/usr/local/libexec/berth-boot-expire" <<'EOF'
#!/bin/bash
# berth guest-side expiry after a boot: the grant timers were transient and went with the old boot.
# Each grant on record ($S/expiries: unit user generation expiry) ends now if its expiry passed, else its timer is set again.
R="$(printenv BERTH_GUEST_ROOT || true)"
S="$R/var/lib/berth"
exec 9>"$S/lock"
flock 9
now=$(date +%s)
while read -r unit user gen exp; do
  [ -n "$unit" ] || continue
  left=$(( exp - now ))
  if [ "$left" -le 0 ] || ! systemd-run --quiet --unit "$unit" --on-active="$left"s --timer-property=AccuracySec=1s "$R/usr/local/libexec/berth-expire" "$user" "$gen"; then
    "$R/usr/local/libexec/berth-expire" "$user" "$gen"
  fi
done < <(cat "$S/expiries" 2>/dev/null || true)
EOF
chmod 755 "$R/usr/local/libexec/berth-boot-expire"
mkdir -p "$R/etc/systemd/system"
cat > "$R/etc/systemd/system/berth-boot-expire.service" <<EOF
[Unit]
Description=berth: end expired grants and set their expiry timers again after a boot
After=local-fs.target
Before=sshd.service ssh.service

[Service]
Type=oneshot
ExecStart=$R/usr/local/libexec/berth-boot-expire

[Install]
WantedBy=multi-user.target
EOF
systemctl enable berth-boot-expire.service >/dev/null 2>&1 || refuse boot_expiry_failed "systemctl enable berth-boot-expire.service failed; a grant's expiry would not survive a reboot"
chmod 755 "$R/usr/local/libexec/berth-expire"
# sshd must take the drop-in: a failed reload, or an sshd that reads another key file for the user, fails the enrollment.
if ! systemctl reload sshd >/dev/null 2>&1 && ! systemctl reload ssh >/dev/null 2>&1; then
  refuse sshd_reload_failed "neither 'systemctl reload sshd' nor 'systemctl reload ssh' succeeded; the per-user key file would not be in effect"
fi
akf="$(PATH="$PATH:/usr/sbin" sshd -T -C "user=$MACHINE,host=localhost,addr=127.0.0.1" 2>/dev/null | awk 'tolower($1) == "authorizedkeysfile" { $1 = ""; sub(/^ /, ""); print; exit }' || true)"
case "$akf" in
  "/etc/berth/keys/%u" | "/etc/berth/keys/$MACHINE") ;;
  *) refuse sshd_keys_file "sshd reads '$akf' as the key file of user $MACHINE, not /etc/berth/keys/%u (sshd_config must Include /etc/ssh/sshd_config.d/*.conf before any Match block)" ;;
esac
if [ -n "$KEEPER" ]; then
  keys_without ' berth:keeper$'
  printf '%s berth:keeper\n' "$(printf '%s' "$KEEPER" | base64 -d)" >> "$K"
fi
hostkey="$(cut -d' ' -f1,2 "$R/etc/ssh/ssh_host_ed25519_key.pub")"
done_with "{\"incarnation\":\"$(boot)\",\"hostKey\":\"$hostkey\",\"user\":\"$MACHINE\"}"
`,
  install_key: String.raw`
bound
[ "$GEN" -gt "$sealed" ] || refuse generation_sealed "the keys of generation $GEN were already removed; a late install restores nothing"
at_generation
left=$(( EXPIRES_S - $(date +%s) ))
[ "$left" -gt 0 ] || refuse grant_expired "the grant expired $(( -left ))s ago"
unit="berth-expire-$MACHINE-g$GEN"
systemctl stop "$unit.timer" >/dev/null 2>&1 || true
# The guest's own end of access goes in BEFORE the key: there is never a key without it.
systemd-run --quiet --unit "$unit" --on-active="$left"s --timer-property=AccuracySec=1s "$R/usr/local/libexec/berth-expire" "$MACHINE" "$GEN"
echo "$unit" >> "$S/timers"
# Recorded for the boot-time check: the transient timer does not survive a reboot, this line does.
echo "$unit $MACHINE $GEN $EXPIRES_S" >> "$S/expiries"
keys_without " berth:g$GEN:"
line="$(printf 'expiry-time="%s" %s berth:g%s:%s' "$(date -u -d "@$EXPIRES_S" +%Y%m%d%H%M%SZ)" "$(printf '%s' "$KEY" | base64 -d)" "$GEN" "$GRANT")"
printf '%s\n' "$line" >> "$K"
# Read back: the key file sshd reads for the user holds exactly this line for the grant, once.
got="$(grep -F " berth:g$GEN:$GRANT" "$K" || true)"
if [ "$got" != "$line" ]; then
  keys_without " berth:g$GEN:"
  systemctl stop "$unit.timer" >/dev/null 2>&1 || true
  grep -v "^$unit " "$S/expiries" > "$S/expiries.tmp" || true; mv "$S/expiries.tmp" "$S/expiries"
  refuse key_not_installed "the key file read back $(printf '%s' "$got" | grep -c . || true) line(s) for grant $GRANT, not the line written"
fi
done_with "{\"grantId\":\"$GRANT\",\"generation\":$GEN,\"expiresAtS\":$EXPIRES_S,\"keys\":$(count_keys),\"installed\":\"$(printf '%s' "$got" | base64 -w0)\"}"
`,
  remove_key: String.raw`
bound
at_generation
before="$(count_keys)"
drop_grant_keys
[ "$GEN" -le "$sealed" ] || echo "$GEN" > "$S/sealed"
done_with "{\"removed\":$(( before - $(count_keys) )),\"keysRemaining\":$(count_keys)}"
`,
  // Not recorded as done: it only ever removes keys and records the boot id once, so running it again is harmless.
  fence_prepare: String.raw`
bound
at_generation
drop_grant_keys
[ "$GEN" -le "$sealed" ] || echo "$GEN" > "$S/sealed"
f="$S/ops/$OP.fence"
[ -f "$f" ] || boot > "$f"
result "{\"bootBefore\":\"$(cat "$f")\",\"boot\":\"$(boot)\",\"keysRemaining\":$(count_keys)}"
`,
  boot_id: String.raw`
result "{\"boot\":\"$(boot)\"}"
`,
  scrub: String.raw`
bound
at_generation
pkill -KILL -u "$MACHINE" || true
crontab -r -u "$MACHINE" >/dev/null 2>&1 || true
home="$R/home/$MACHINE"
if [ -d "$home" ]; then find "$home" -mindepth 1 -delete; fi
done_with "{\"scrubbed\":true,\"incarnation\":\"$(boot)\"}"
`,
};

/** The full program for one step, with every value validated and quoted. */
export function guestProgram(t: GuestTarget, step: GuestStep): string {
  const vars = [
    `OP=${q(t.opId)}`,
    `INSTANCE=${q(t.instanceId)}`,
    `MACHINE=${q(t.machineId)}`,
    `POOL=${q(t.pool)}`,
    `GEN=${q(String(t.generation))}`,
  ];
  if (step.kind === "enroll") vars.push(`KEEPER='${step.keeperKey ? keyB64(step.keeperKey) : ""}'`);
  if (step.kind === "install_key") {
    vars.push(`KEY='${keyB64(step.publicKey)}'`, `GRANT=${q(step.grantId)}`, `EXPIRES_S=${q(String(Math.floor(step.expiresAt / 1000)))}`);
  }
  return `${vars.join("\n")}\n${PRELUDE}${STEPS[step.kind]}`;
}

export type GuestReply = { kind: "result"; value: Record<string, unknown> } | { kind: "refused"; code: string; message: string } | { kind: "garbled"; output: string };

/** Reads the program's answer from its standard output. */
export function parseGuestOutput(stdout: string): GuestReply {
  for (const line of stdout.split("\n").reverse()) {
    if (line.startsWith("BERTH-RESULT ")) {
      try {
        return { kind: "result", value: JSON.parse(line.slice("BERTH-RESULT ".length)) as Record<string, unknown> };
      } catch {
        return { kind: "garbled", output: line.slice(0, 200) };
      }
    }
    if (line.startsWith("BERTH-REFUSED ")) {
      const rest = line.slice("BERTH-REFUSED ".length);
      const sp = rest.indexOf(" ");
      return { kind: "refused", code: sp < 0 ? rest : rest.slice(0, sp), message: sp < 0 ? "" : rest.slice(sp + 1) };
    }
  }
  return { kind: "garbled", output: stdout.slice(-200) };
}
