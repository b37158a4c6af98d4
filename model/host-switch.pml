/*
 * berth — the host identity switch as a Promela model (docs/host-identity.md,
 * src/agent/identity/switch.ts), checked exhaustively by SPIN through
 * test/model/host-switch-spin.test.ts.
 *
 * One agent with M machines, its switch record on disk, and a coordinator.
 * The record is written whole: a rename puts it in place (`page`, what a
 * read sees) and only a directory sync makes it durable (`disk`). A crash
 * of the agent loses its memory and, for a record renamed but not synced,
 * either keeps it (the kernel wrote it back) or loses it. The environment
 * also damages the record file once (unreadable), loses stopped reports in
 * transit or in the coordinator's failed writes, and crashes the agent, all
 * within bounds.
 *
 * Invariants, as assertions (named through a `hidden` bit that is always 0,
 * so SPIN's report says which one broke):
 *   inv_no_legacy_after_local   the enroll token is never used once a
 *                               `local` record was durable;
 *   inv_durable_before_irreversible  retiring a machine, the cloud commit
 *                               and the purge run only on a record this
 *                               process knows durable, and it is the one
 *                               on disk;
 *   inv_reports_taken           when the agent is done (active, nothing
 *                               owed) every machine it retired was taken by
 *                               the coordinator (or was moot).
 *
 *
 * An attacker holds only the shared enroll token. At any moment it enrolls
 * under the host's name with its own URL, SSH address, host key and
 * identity key (legacy, prepared, committed, active, awaiting: every
 * state); it answers an `activate` prepare once in the host's place (the
 * host's address taken over: a recycled IP, a hijacked name); it replays
 * the real agent's session proof once it has seen one; and after an
 * operator's `berth host reset-identity` it holds the one-time token once
 * the real agent has spent it (read from the wire or a file) and enrolls
 * with it. The coordinator's host row is modelled as who owns the
 * recorded key (`keyOf`), who registered the URL/SSH address/host key
 * (`sshOf`) and whether the attacker holds a credential the coordinator
 * accepts for the host (`atkCred`: its host-call token or a host
 * credential). A monitor checks, in every reachable state:
 *   inv_not_stranded            the coordinator never goes back to the
 *                               enroll token once the agent's `local`
 *                               record was durable (the agent refuses the
 *                               token: neither credential would work);
 *   inv_key_proven              the key the coordinator records is only
 *                               ever the real agent's (proven by the
 *                               host's current credential, or after a
 *                               reset by the unspent one-time token);
 *   inv_borrowers_to_proven     the URL, SSH address and host key the
 *                               coordinator sends callers and borrowers to
 *                               are only ever the real agent's;
 *   inv_one_credential          the attacker never holds a credential the
 *                               coordinator accepts for the host.
 *
 * Mutants (-D flags) each break one rule and must be caught:
 *   MUTANT_RUN_UNDURABLE        go on after the rename, without the sync;
 *   MUTANT_DAMAGED_IS_LEGACY    an unreadable record counts as none;
 *   MUTANT_DROP_OWED_ON_SEND    an owed report leaves the record when sent;
 *   MUTANT_ENROLL_PREPARED      issue 22 item 1: an enrollment under the
 *                               name of a `prepared` host sets it back to
 *                               legacy, drops its pending key, re-points
 *                               it and answers its host-call token;
 *   MUTANT_PREPARE_UNPROVEN     item 2: the prepare's answer is taken
 *                               without the proof of the host-call token
 *                               (`activate --force` records whatever key
 *                               answers at the host's address);
 *   MUTANT_ENROLL_LEGACY        item 3: an enrollment under the name of a
 *                               `legacy` host re-points it and answers its
 *                               host-call token;
 *   MUTANT_PREPARED_REVERTS     the coordinator sets a `prepared` host back
 *                               to legacy on its own (a prepare timeout);
 *   MUTANT_PROOF_REPLAY         a used challenge is accepted again (a
 *                               captured session proof gets a credential);
 *   MUTANT_RESET_SHARED_TOKEN   an `awaiting` host takes the shared enroll
 *                               token, not only the reset's one-time one;
 *   MUTANT_RESET_TOKEN_REUSABLE the one-time token is not spent by use.
 * Witnesses (each must be reached, so the checked space is not vacuous):
 *   WITNESS_DONE_AFTER_FAULTS   the end after a damaged record and a lost
 *                               report;
 *   WITNESS_REBOUND_UNDER_ATTACK the host bound again after a reset, the
 *                               attacker having enrolled while it was
 *                               prepared and while it awaited, replayed a
 *                               proof and answered a prepare.
 *
 * Not modelled: generations (the coordinator ignores a report not at the
 * machine's current generation: src/core/host-identity.ts, unit-tested),
 * the prepare's refusal (nothing changes), several coordinators, a reset
 * before the switch ended (the model resets only an active host), an
 * attacker that reads traffic before it is delivered (the threat model
 * puts the coordinator behind HTTPS: docs/host-identity.md).
 */
#define M 2
#define NONE 0
#define LOCAL 1
#define CLOUD 2
#define ACTIVE 3
#define DAMAGED 4
#define MAXCRASH 2
#define MAXLOSS 2
#define AWAITING 4
#define NOBODY 0
#define REAL 1
#define ATK 2

bit inv_no_legacy_after_local, inv_durable_before_irreversible, inv_reports_taken, witness;
bit inv_not_stranded, inv_key_proven, inv_borrowers_to_proven, inv_one_credential;

byte disk = NONE;          /* the durable record */
byte page = NONE;          /* the record a read sees (renamed into place) */
bool diskOwed[M];
bool pageOwed[M];
bool floorClaimed;

bool alive = true;         /* the agent process runs */
byte mem = NONE;           /* the record this process holds */
bool durable;              /* ... known durable in this process */
bool memOwed[M];
bool announced;

bool running[M];           /* the machine's sandbox exists */
bool retired[M];           /* retired by the switch */
bool retireOp[M];          /* the agent store's durable operation record */
bool rowLive[M];           /* the coordinator's row (not destroyed) */
byte coord = 0;            /* 0 legacy, 1 prepared, 2 committed, 3 active, 4 awaiting (after a reset) */
byte keyOf = NOBODY;       /* whose key the coordinator records (pending or committed) */
byte sshOf = REAL;         /* who registered the host's URL, SSH address and host key */
bool atkCred;              /* the attacker holds a credential the coordinator accepts for the host */
bool sessionSeen;          /* the real agent used a session proof (the attacker may have captured it) */
byte resetTok = 0;         /* the reset's one-time token: 0 none, 1 issued, 2 spent by the real agent */
bool tookAddress;          /* the attacker answered a prepare in the host's place */
bool triedPrepared, triedAwaiting, triedReplay;
bool everDurableLocal;
bool tokenPurged;
byte crashes, losses, damages;

chan reports = [M] of { byte };

/* A whole write: rename into place (not durable yet). */
inline renameRecord() {
  page = mem; i = 0;
  do :: i < M -> pageOwed[i] = memOwed[i]; i++ :: else -> break od;
  durable = false
}

inline allRetired(r) {
  r = true; i = 0;
  do :: i < M -> if :: running[i] -> r = false :: else -> skip fi; i++ :: else -> break od
}

inline noneOwed(r) {
  r = true; i = 0;
  do :: i < M -> if :: memOwed[i] -> r = false :: else -> skip fi; i++ :: else -> break od
}

/* The retirement's plan owes every machine it retired again (or the coordinator said it is moot) before the commit. */
#define REOWED ((!retireOp[0] || memOwed[0] || !rowLive[0]) && (!retireOp[1] || memOwed[1] || !rowLive[1]))

#ifdef MUTANT_RUN_UNDURABLE
#define READY (mem != NONE)
#else
#define READY (durable)
#endif

active proctype agent() {
  byte i, j;
  bool r;
  do
  /* Boot (after a crash): the record is read; a damaged one is local; a floor without one is local. */
  :: atomic { !alive ->
       alive = true; announced = false;
       i = 0; do :: i < M -> memOwed[i] = pageOwed[i]; i++ :: else -> break od;
#ifdef MUTANT_DAMAGED_IS_LEGACY
       if :: page == DAMAGED -> mem = NONE :: else -> mem = page fi;
#else
       if :: page == DAMAGED -> mem = LOCAL :: else -> mem = page fi;
       if :: mem == NONE && floorClaimed -> mem = LOCAL :: else -> skip fi;
#endif
       if :: page == DAMAGED -> i = 0; do :: i < M -> memOwed[i] = false; i++ :: else -> break od :: else -> skip fi;
       durable = false }
  /* Legacy: the agent (re-)enrolls with the shared token. */
  :: atomic { alive && mem == NONE && coord < 2 ->
       assert(inv_no_legacy_after_local || !everDurableLocal) }
  /* Prepare, then the local commit: the coordinator records the key; the record `local` is renamed into place. */
  :: atomic { alive && mem == NONE && !floorClaimed && coord < 2 ->
       coord = 1; keyOf = REAL; sessionSeen = true; mem = LOCAL; renameRecord() }
  /* The sync (ensureDurable): the held record is rewritten if it differs, then made durable. */
  :: atomic { alive && mem != NONE && !durable ->
       if :: page != mem -> renameRecord() :: else -> skip fi;
       disk = page; i = 0; do :: i < M -> diskOwed[i] = pageOwed[i]; i++ :: else -> break od;
       durable = true;
       if :: mem == LOCAL -> everDurableLocal = true :: else -> skip fi }
  /* Local step: retire a machine (irreversible); its report is owed in the record. */
  :: atomic { alive && mem == LOCAL && READY && running[0] ->
       assert(inv_durable_before_irreversible || (durable && disk == mem));
       running[0] = false; retired[0] = true; retireOp[0] = true; memOwed[0] = true; renameRecord() }
  :: atomic { alive && mem == LOCAL && READY && running[1] ->
       assert(inv_durable_before_irreversible || (durable && disk == mem));
       running[1] = false; retired[1] = true; retireOp[1] = true; memOwed[1] = true; renameRecord() }
  /* Local step again after a lost record: a machine retired before is owed again (its operation record), unless moot. */
  :: atomic { alive && mem == LOCAL && READY && retireOp[0] && !memOwed[0] && rowLive[0] -> memOwed[0] = true; renameRecord() }
  :: atomic { alive && mem == LOCAL && READY && retireOp[1] && !memOwed[1] && rowLive[1] -> memOwed[1] = true; renameRecord() }
  /* Send an owed report (best effort; may be lost). */
  :: atomic { alive && READY && mem != NONE && memOwed[0] && nfull(reports) -> reports!0;
#ifdef MUTANT_DROP_OWED_ON_SEND
       memOwed[0] = false; renameRecord()
#endif
     }
  :: atomic { alive && READY && mem != NONE && memOwed[1] && nfull(reports) -> reports!1;
#ifdef MUTANT_DROP_OWED_ON_SEND
       memOwed[1] = false; renameRecord()
#endif
     }
  /* The answer: a report the coordinator took (or found moot) leaves the record. */
  :: atomic { alive && READY && memOwed[0] && !rowLive[0] -> memOwed[0] = false; renameRecord() }
  :: atomic { alive && READY && memOwed[1] && !rowLive[1] -> memOwed[1] = false; renameRecord() }
  /* Claim the floor, then the cloud commit (irreversible), record `cloud`. */
  :: atomic { alive && mem == LOCAL && READY -> allRetired(r); if :: r -> floorClaimed = true :: else -> skip fi }
  :: atomic { alive && mem == LOCAL && READY && floorClaimed && REOWED -> allRetired(r);
       if :: r ->
            assert(inv_durable_before_irreversible || (durable && disk == mem));
            coord = 2; mem = CLOUD; renameRecord()
          :: else -> skip fi }
  /* Purge (irreversible), record `active`. */
  :: atomic { alive && mem == CLOUD && READY ->
       assert(inv_durable_before_irreversible || (durable && disk == mem));
       tokenPurged = true; mem = ACTIVE; renameRecord() }
  /* Advertise once the active record is durable. */
  :: atomic { alive && mem == ACTIVE && READY && !announced -> coord = 3; announced = true }
  /* Done: active, announced, nothing owed. Every retired machine was taken. */
  :: atomic { alive && mem == ACTIVE && durable && announced && disk == ACTIVE && empty(reports) && crashes == MAXCRASH ->
       noneOwed(r);
       if :: r ->
            i = 0;
            do :: i < M -> assert(inv_reports_taken || !(retired[i] && rowLive[i])); i++ :: else -> break od;
#ifdef WITNESS_DONE_AFTER_FAULTS
            /* the end is reached after a damaged record and a lost report (the search is not vacuous) */
            assert(witness || !(damages == 1 && losses > 0 && retired[0] && retired[1]));
#endif
            break
          :: else -> skip fi }
  od;
  /* An operator's `berth host reset-identity` (or none), then the agent, started with the one-time token, binds its new key. */
  if
  :: atomic { coord = AWAITING; keyOf = NOBODY; resetTok = 1 }
     atomic {
       if
       :: coord == AWAITING && resetTok == 1 ->
            coord = ACTIVE; keyOf = REAL; sshOf = REAL; resetTok = 2; sessionSeen = true;
#ifdef WITNESS_REBOUND_UNDER_ATTACK
            assert(witness || !(triedPrepared && triedAwaiting && triedReplay && tookAddress))
#else
            skip
#endif
       :: else -> skip
       fi }
  :: skip
  fi
}

/*
 * The attacker: the shared enroll token, its own agent at its own address.
 * A refused call changes nothing (the coordinator's answer carries no token).
 */
active proctype attacker() {
  end: do
  /* Enroll under the host's name, in whatever state the host is. */
  :: atomic { coord == 0 ->
#ifdef MUTANT_ENROLL_LEGACY
       sshOf = ATK; atkCred = true
#else
       skip
#endif
     }
  :: atomic { coord == 1 -> triedPrepared = true;
#ifdef MUTANT_ENROLL_PREPARED
       coord = 0; keyOf = NOBODY; sshOf = ATK; atkCred = true
#else
       skip
#endif
     }
  :: atomic { coord == AWAITING -> triedAwaiting = true;
#ifdef MUTANT_RESET_SHARED_TOKEN
       coord = ACTIVE; keyOf = ATK; sshOf = ATK; atkCred = true
#else
       skip
#endif
     }
  /* An operator's `activate` (--force or not) reaches the attacker at the host's address: it answers with its key, without a proof of the host-call token it does not hold. */
  :: atomic { coord == 0 && !tookAddress -> tookAddress = true;
       if
#ifdef MUTANT_PREPARE_UNPROVEN
       :: true -> coord = 1; keyOf = ATK
#endif
       :: atkCred -> coord = 1; keyOf = ATK   /* a proof it could make only with the host's token */
       :: else -> skip
       fi }
  /* Replay the real agent's session proof (its challenge already used). */
  :: atomic { sessionSeen && !triedReplay -> triedReplay = true;
#ifdef MUTANT_PROOF_REPLAY
       atkCred = true; sshOf = ATK   /* a host credential, then describe: its own URL and SSH */
#else
       skip
#endif
     }
  /* Enroll with the reset's one-time token, spent by the real agent. */
  :: atomic { resetTok == 2 && coord == ACTIVE ->
#ifdef MUTANT_RESET_TOKEN_REUSABLE
       keyOf = ATK; sshOf = ATK; atkCred = true
#else
       skip
#endif
     }
  od
}

/* The invariants, in every reachable state. */
active proctype monitor() {
  end: do
  :: atomic { everDurableLocal && coord == 0 -> assert(inv_not_stranded || !(everDurableLocal && coord == 0)) }
  :: atomic { keyOf == ATK -> assert(inv_key_proven || keyOf != ATK) }
  :: atomic { sshOf != REAL -> assert(inv_borrowers_to_proven || sshOf == REAL) }
  :: atomic { atkCred -> assert(inv_one_credential || !atkCred) }
  od
}

/* The coordinator takes a report (destroys the row at its generation), or fails to write it. */
active proctype coordinator() {
  byte m;
  end: do
  /* A prepared host is honoured whatever happens later: no timer sets it back to legacy. */
  :: atomic { coord == 1 ->
#ifdef MUTANT_PREPARED_REVERTS
       coord = 0; keyOf = NOBODY
#else
       skip
#endif
     }
  :: reports?m ->
       if
       :: atomic { losses < MAXLOSS -> losses++ }
       :: rowLive[m] = false
       fi
  od
}

/* Faults: agent crashes (a renamed record kept or lost), one damaged record. */
active proctype environment() {
  byte i;
  end: do
  :: atomic { alive && crashes < MAXCRASH ->
       crashes++; alive = false;
       if
       :: disk = page; i = 0; do :: i < M -> diskOwed[i] = pageOwed[i]; i++ :: else -> break od
       :: page = disk; i = 0; do :: i < M -> pageOwed[i] = diskOwed[i]; i++ :: else -> break od
       fi }
  :: atomic { !alive && damages < 1 && page != NONE -> damages++; page = DAMAGED; disk = DAMAGED }
  :: atomic { crashes < MAXCRASH -> crashes = MAXCRASH }  /* no more crashes from here */
  od
}

init {
  atomic { running[0] = true; running[1] = true; rowLive[0] = true; rowLive[1] = true }
}
