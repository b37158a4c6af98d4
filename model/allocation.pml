/*
 * berth — an allocation's launch, takeover, withdrawal and release as a
 * Promela model (docs/allocations.md; src/coordinator/actions/allocation-
 * launch.ts, allocation-cleanup.ts, host-standing.ts; src/agent/operations/
 * alloc-*.ts, src/agent/standing.ts), checked exhaustively by SPIN through
 * test/model/allocation-spin.test.ts.
 *
 * One allocation on one host. Two coordinators (either may act, take over
 * or clean up; every atomic step of theirs is one store transaction or one
 * observation of the agent), the agent (its store: the hold with its floor,
 * the standing epoch, the sandbox), and an environment: the launch actor's
 * lease lapses (the actor never starts another call, but its calls in
 * flight still arrive), the owner releases, the operator withdraws the
 * host, the sandbox dies (killed from outside). A ready allocation whose
 * sandbox died is `failed` (src/coordinator/actions/allocation-watch.ts);
 * the owner may restart it: the request and then its drive each check the
 * host's standing, and the drive sends a launch again at the actor's
 * generation with the standing epoch it was decided under (the agent moves
 * to a newer epoch as ready, src/agent/standing.ts). Calls to the agent
 * (hold, launch, restart, release, standing) travel in a bag: delayed,
 * reordered, delivered twice (bounded); an agent operation answers a
 * repeated delivery from its record. Replies are the agent's durable
 * records, read by a later step (a lost reply is a read that never
 * happens).
 *
 * Invariants, as assertions (named through a `hidden` bit that is always 0,
 * so SPIN's report says which one broke):
 *   inv_one_hold        at most one generation's hold is live on the host;
 *   inv_fenced          once a replacement decided a new generation on an
 *                       observation that saw no hold, no hold below that
 *                       generation is ever taken (whichever arrives first);
 *   inv_no_launch_after_withdraw  no launch (or restart) starts on the
 *                       host after its withdrawal was acknowledged (reported
 *                       `withdrawn`), and a withdrawal is acknowledged only
 *                       while the agent stores it (so it refuses every later
 *                       launch decided under that epoch or an older one);
 *   inv_budget          the budget is charged exactly while the allocation
 *                       is not released, and it is returned only once the
 *                       agent proved the cleanup (no sandbox, no machine
 *                       record, no hold), or on a host gone for good;
 *   inv_ends            no decision keeps the obligation (retain) when
 *                       nothing else can change the outcome (no live actor,
 *                       no call in flight), and where nothing more can
 *                       happen at all the allocation is released.
 *
 * Mutants (-D flags) each put a known bug back and must be caught:
 *   MUTANT_NO_FLOOR      the observation does not raise the agent's floor
 *                        (issue item 1: a late hold of the dead actor lands
 *                        after the replacement observed);
 *   MUTANT_RETAIN_STALE  the code before the fix: no floor, and a hold of
 *                        another generation retained, never cleaned (issue
 *                        item 1: release stays releasing; inv_fenced is
 *                        silenced so the wedge itself is caught);
 *   MUTANT_NO_EPOCH      the agent does not check a launch's standing epoch
 *                        (issue item 2: a withdrawn host still launches);
 *   MUTANT_ACK_UNPUSHED  the coordinator reports a withdrawal before the
 *                        agent stored it (issue item 2);
 *   MUTANT_REFUND_EARLY  the reservation is returned when the release is
 *                        sent, not when it is proven;
 *   MUTANT_RESTART_UNGATED  the restart's drive sends the host's current
 *                        standing epoch without checking the standing again
 *                        (the code before 3a62216: a host withdrawn between
 *                        the request and the drive is moved back to ready by
 *                        the restart, the withdrawal push is then not newer,
 *                        and the withdrawal is acknowledged while the agent
 *                        would still launch).
 * Witnesses, so the checked space is not vacuous:
 * -DWITNESS_READY_AFTER_TAKEOVER ready after a lapsed actor's hold was
 * fenced; -DWITNESS_RESTARTED ready again after the sandbox died and a
 * restart ran.
 *
 * The operator's arms, each in its own configuration (-D flag) so that
 * each is checked against everything above without the product of all
 * three (docs/testing.md gives each one's size):
 *   ARM_RESOLVE   the agent restarts after the sandbox died and finds the
 *                 machine not matching its record: a release is refused
 *                 there (not recorded: a later copy acts afresh), and a
 *                 release whose outcome stays unknown (its call in flight,
 *                 its answer lost: five tries) quarantines too. `berth
 *                 alloc resolve --destroy|--keep-volume` is always
 *                 eventually available on a quarantine: it records the
 *                 choice, the cleanup (the same observation and tombstone)
 *                 sends the agent a release of its own with `resolve`,
 *                 which destroys the mismatched machine and keeps or wipes
 *                 the volume; slot and budget come back only when that is
 *                 proven (allocation-release.ts resolveAllocation,
 *                 allocation-cleanup.ts; src/agent/operations/alloc-
 *                 release.ts). The volume is modelled: created by the
 *                 launch, kept or wiped by the first release that ends.
 *   ARM_HOSTGONE  the host dies for good (its agent never answers again,
 *                 its calls in flight never arrive, its sandbox is gone);
 *                 the cleanup then reads nothing and quarantines; the
 *                 operator attests it (`standing withdrawn --host-gone`:
 *                 a new epoch counted acknowledged without the agent) and
 *                 `alloc resolve --host-gone` returns slot and budget
 *                 unproven, in one transaction (endOnGoneHost).
 *   ARM_EXPIRY    the allocation's expiry comes (always, once, at any
 *                 point): a release with cause expiry, through the same
 *                 transaction as the owner's (onAllocationExpiryDue,
 *                 releaseIn), idempotent with it.
 * With every arm, and as the code does, the launch actor keeps acting while
 * its record is its own whatever the allocation's state (act() checks the
 * standing before the launch, not the allocation's state): a release or
 * expiry does not stop its calls, the cleanup's tombstone and the agent's
 * release do.
 *
 * More invariants with the arms:
 *   inv_kept      a volume the coordinator recorded as kept (or is about
 *                 to) is never wiped afterwards;
 *   inv_ends      (also) when nothing more can happen at all (SPIN's
 *                 timeout), the allocation is released: every quarantine
 *                 was ended by an operator command, every release proven
 *                 or ended on a gone host.
 * Mutants of the arms:
 *   MUTANT_RESOLVE_EARLY   (ARM_RESOLVE) resolve returns slot and budget
 *                          when the operator asks, before the agent proved
 *                          the cleanup;
 *   MUTANT_LATE_WIPE       (ARM_RESOLVE) a release that reaches the agent
 *                          after the hold was released (a copy delayed in
 *                          flight) releases the volume by its own choice:
 *                          the code before the fix wiped the volume the
 *                          operator's resolve had kept;
 *   MUTANT_GONE_UNATTESTED (ARM_HOSTGONE) resolve --host-gone accepted on
 *                          any acknowledged withdrawal, without the
 *                          operator's attestation (the code before the fix:
 *                          a live agent's sandbox outlives the refund);
 *   MUTANT_GONE_CHARGED    (ARM_HOSTGONE) host-gone ends the allocation but
 *                          leaves slot and budget charged;
 *   MUTANT_EXPIRY_UNFENCED (ARM_EXPIRY) expiry releases a launching
 *                          allocation at once with the refund, as if it had
 *                          never launched: the actor's launch then lands.
 * Witnesses of the arms: -DWITNESS_RESOLVED (ARM_RESOLVE) released by an
 * operator's resolve of a mismatched machine; -DWITNESS_HOST_GONE
 * (ARM_HOSTGONE) released on a gone host; -DWITNESS_EXPIRED (ARM_EXPIRY)
 * released by expiry after the launch took its hold.
 *
 * -DWITNESS_QUIESCENT reaches a state where nothing more can happen (so the
 * end-of-run checks of inv_ends and inv_budget are not vacuous).
 *
 * Not modelled: an unreadable agent that answers again later (retain,
 * quarantine after five tries: unit- and end-to-end tested; the five tries
 * are one step here), an operator's attestation of a host that is not gone
 * (the command is the operator's word; nothing can check it), several
 * allocations on one host (two do not fit a CI budget: each allocation's
 * variables double the state vector and the interleavings multiply, about
 * 0.4 M states each alone), a kept volume attached to a new allocation.
 */
#ifndef MAXLAPSE
#define MAXLAPSE 1          /* lapses of a launch actor while launching (-DMAXLAPSE=2: a bigger, slower check) */
#endif
#define G (MAXLAPSE + 3)    /* generations 0..G-1 (0 = none): 1, one per takeover, one for the tombstone */
#define MAXDUP 1            /* deliveries of a call more than once */
#ifndef MAXDEATH
#define MAXDEATH 1          /* deaths of the sandbox (-DMAXDEATH=2: a bigger, slower check) */
#endif

/* The code before the fix as a whole: no floor, and a stale hold retained. inv_fenced is silenced so
   that what it leads to, the wedge, is what is caught. */
#ifdef MUTANT_RETAIN_STALE
#define MUTANT_NO_FLOOR
#define FENCED_CHECKED 0
#else
#define FENCED_CHECKED 1
#endif

/* allocation states */
#define PLACED 1
#define LAUNCHING 2
#define READY 3
#define RELEASING 4
#define RELEASED 5
#define FAILED 6
#define QUAR 7

bit inv_one_hold, inv_fenced, inv_no_launch_after_withdraw, inv_budget, inv_ends, inv_kept, witness;

/* a restart (one per death, 1..MAXDEATH): requested, sent, with the generation and epoch it carries */
#define R (MAXDEATH + 1)

/* ---- coordinator store ---- */
byte alloc = PLACED;
bool charged = true;
byte recGen = 0;            /* the actor record's generation (0: none) */
bool recTomb;               /* ... a tombstone */
byte owner = 0;             /* the coordinator acting (1, 2) */
bool alive;                 /* the actor's lease still runs */
bool cWithdrawn;            /* the host's recorded standing is withdrawn */
byte cEpoch = 0;            /* its standing epoch */
byte cAcked = 0;            /* the epoch the agent acknowledged (or an operator attested gone) */
byte wEpoch = 0;            /* the withdrawal's epoch (0: none) */
byte fencedBelow = 0;       /* highest generation decided on an "absent" observation (for inv_fenced) */
bool sentHold[6];
bool sentLaunch[6];
bool sentRelease;           /* the cleanup's alloc_release (one operation id per allocation) */
byte restarts = 0;          /* restarts requested so far (the current one's index) */
bool restartWanted;         /* the current restart requested, its drive not yet run */
bool restartSent[R];
byte resolveChoice = 0;     /* an operator's resolve under way: 0 none, 1 --destroy, 2 --keep-volume */
bool sentResolve;           /* the cleanup's alloc_release with resolve (its own operation id) */
bool goneAttested;          /* an operator attested the host gone (standing withdrawn --host-gone) */
bool reportedKept;          /* the coordinator recorded the allocation released with its volume kept */
bool byExpiry;              /* the release was the expiry's */

/* ---- agent store ---- */
byte heldMask = 0;          /* generations whose hold is live (bit g) */
byte floor = 0;             /* the hold's floor (`fenced`) */
bool released;              /* the hold released for good */
byte aEpoch = 0;            /* the standing epoch the agent stored */
bool aWithdrawn;
bool sandbox;               /* the allocation's sandbox runs */
bool machine;               /* its machine record exists (from the launch until a release destroys it) */
bool mismatch;              /* the agent restarted and found the machine not matching its record */
byte vol = 0;               /* the volume: 0 none, 1 on disk, 2 wiped */
bool launched[6];
bool launchRefused[6];
bool relDone;               /* the agent's record of the cleanup's release: done ... */
bool relKept;               /* ... with the volume kept */
bool resDone;               /* the agent's record of the resolve's release: done ... */
bool resKept;               /* ... with the volume kept */
bool restarted[R];          /* the agent's record of each restart operation: started ... */
bool restartRefused[R];     /* ... or refused */

/* ---- calls in flight (a bag: any order, any delay) ---- */
byte holdMsg[6];
byte launchMsg[6];
byte launchEpoch[6];
byte relMsg;
byte resMsg;
byte restartMsg[R];
byte restartGen[R];
byte restartEpoch[R];
byte standMsg;              /* the epoch a standing push carries (0: none in flight) */
byte dups, lapses, deaths;
bool wantRelease;
bool sawFencedLateHold;

/* ---- the environment's one-off events ---- */
bool expiryCame;            /* ARM_EXPIRY */
bool hostDead;              /* ARM_HOSTGONE: the agent never answers again, its calls in flight never arrive */
bool agentRestarted;        /* ARM_RESOLVE */

#ifdef MUTANT_NO_EPOCH
#define EPOCH_OK(e) (1)
#else
#define EPOCH_OK(e) (!((e) < aEpoch || ((e) == aEpoch && aWithdrawn)))
#endif
/* a launch decided under a newer epoch moves the agent to it, as ready (src/agent/standing.ts) */
#define RAISE(e) if :: (e) > aEpoch -> aEpoch = (e); aWithdrawn = false :: else -> skip fi
#define HELD(g) (((heldMask >> (g)) & 1) == 1)
#define HOLDOF(h) h = 0; if :: HELD(1) -> h = 1 :: HELD(2) -> h = 2 :: HELD(3) -> h = 3 :: HELD(4) -> h = 4 :: else -> skip fi
#if MAXDEATH >= 2
#define RESTARTS_INFLIGHT (restartMsg[1] + restartMsg[2])
#else
#define RESTARTS_INFLIGHT (restartMsg[1])
#endif
#define INFLIGHT (holdMsg[1] + holdMsg[2] + holdMsg[3] + holdMsg[4] + launchMsg[1] + launchMsg[2] + launchMsg[3] + launchMsg[4] + relMsg + resMsg + RESTARTS_INFLIGHT > 0)
#define QUIET (!alive && !INFLIGHT)
/* one delivery of a call in the bag: it stays there for a second delivery (bounded) or leaves it */
#define DELIVER(m) if :: dups < MAXDUP -> dups++ :: m-- fi

/* resolve --host-gone's check beyond an acknowledged withdrawal: the operator's attestation of this epoch */
#ifdef MUTANT_GONE_UNATTESTED
#define GONE_OK (1)
#else
#define GONE_OK (goneAttested)
#endif

/* The reservation returned on proof: nothing of the allocation left on the agent. */
inline refund() {
  assert(inv_budget || (!sandbox && !machine && heldMask == 0 && (relDone || resDone || recGen == 0)));
  charged = false; alloc = RELEASED
}

/* The observation a replacement (or the cleanup) decides on. It raises the floor when no hold is held and
   the prior actor may not act any more (core/allocation-takeover.ts fenceFloor). The decision uses the
   standing read here (the code reads the lease before it observes and decides on both). A gone host's
   agent answers nothing: unreadable. */
inline observe(obs, seenGen, wasAlive, unread) {
  atomic {
    seenGen = recGen; wasAlive = alive; unread = hostDead; obs = 0;
    if
    :: !hostDead ->
#ifndef MUTANT_NO_FLOOR
         if
         :: heldMask == 0 && !released && !alive && !recTomb && floor < recGen + 1 -> floor = recGen + 1
         :: else -> skip
         fi;
#endif
         HOLDOF(obs)
    :: else -> skip
    fi
  }
}

/* The agent's alloc_release: the sandbox destroyed (a mismatched machine only with resolve: the caller
   checks), the volume kept or wiped, the hold released for good (fences every later hold). A release
   that arrives after the hold was released (a copy delayed in flight, another operation id) leaves the
   volume as the first one left it. */
inline agentRelease(keep, kept) {
#ifdef MUTANT_LATE_WIPE
  k = keep;
#else
  k = keep || released;
#endif
  if
  :: vol == 1 && k -> kept = true
  :: vol == 1 && !k -> assert(inv_kept || !reportedKept); vol = 2; kept = false
  :: else -> kept = false
  fi;
  sandbox = false; machine = false; mismatch = false; heldMask = 0; released = true
}

/* The cleanup sends the release its attempt decided: the resolve's while one is recorded, else its own. */
#define SEND if :: wantRes -> sentResolve = true; resMsg++ :: else -> sentRelease = true; relMsg++ fi

proctype coordinator(byte me) {
  byte obs, seenGen, g;
  bool wasAlive, unread, wantRes, k;
  end: do
  /* decide: the first actor (generation 1), or a withdrawn host's placed allocation released at once */
  :: atomic { alloc == PLACED && recGen == 0 ->
       if
       :: cWithdrawn -> refund()
       :: else -> recGen = 1; owner = me; alive = true; alloc = LAUNCHING
       fi }
  /* the actor: hold (act() goes on while the record is its own, whatever the allocation's state) */
  :: atomic { owner == me && alive && !recTomb && recGen > 0 && !sentHold[recGen] ->
       sentHold[recGen] = true; holdMsg[recGen]++ }
  /* the actor: gate (standing, under the owner and host rows), then launch with the epoch decided under;
     a withdrawn host releases a launching allocation and stops the actor */
  :: atomic { owner == me && alive && !recTomb && recGen > 0 && HELD(recGen) && !sentLaunch[recGen] ->
       sentLaunch[recGen] = true;
       if
       :: cWithdrawn -> if :: alloc == LAUNCHING -> alloc = RELEASING :: else -> skip fi
       :: else -> launchMsg[recGen]++; launchEpoch[recGen] = cEpoch
       fi }
  /* the actor: the launch's result recorded (only while launching and the record is its own) */
  :: atomic { alloc == LAUNCHING && owner == me && !recTomb && launched[recGen] ->
       alloc = READY;
#ifdef WITNESS_READY_AFTER_TAKEOVER
       assert(witness || !(recGen >= 2 && sawFencedLateHold))
#endif
     }
  :: atomic { alloc == LAUNCHING && owner == me && !recTomb && launchRefused[recGen] -> alloc = RELEASING }
  /* the watch: the agent says the sandbox is not running -> failed (one observation, then one transaction
     under the owner's lock that moves only a ready allocation; nothing in between moves a ready one back) */
  :: atomic { alloc == READY && !sandbox && !hostDead -> alloc = FAILED }
  /* restart requested (the owner; only from failed): refused while the host is not ready */
  :: atomic { alloc == FAILED && !restartWanted && !restartSent[restarts] && restarts < MAXDEATH ->
       if
       :: cWithdrawn -> skip                                                           /* conflict: nothing changed */
       :: else -> restarts++; restartWanted = true
       fi }
  /* its drive: under the owner then host locks, the standing again, then the launch at the actor's generation */
  :: atomic { alloc == FAILED && restartWanted && !recTomb ->
       restartWanted = false;
       if
#ifndef MUTANT_RESTART_UNGATED
       :: cWithdrawn -> skip                                                           /* restart not done: stays failed */
#endif
       :: else -> restartSent[restarts] = true; restartMsg[restarts]++; restartGen[restarts] = recGen; restartEpoch[restarts] = cEpoch
       fi }
  /* its result recorded: a refusal leaves it failed (reason: the refusal), a start makes it ready again */
  :: atomic { alloc == FAILED && restartSent[restarts] && restartRefused[restarts] -> restartSent[restarts] = false }
  :: atomic { alloc == FAILED && restartSent[restarts] && restarted[restarts] ->
       restartSent[restarts] = false; alloc = READY;
#ifdef WITNESS_RESTARTED
       assert(witness)
#endif
     }
  /* takeover of a lapsed actor (desire: launched) */
  :: alloc == LAUNCHING && !alive && !recTomb && recGen < G - 1 ->
       observe(obs, seenGen, wasAlive, unread);
       atomic {
         if
         :: alloc != LAUNCHING || recGen != seenGen || wasAlive || alive || recTomb || unread -> skip   /* the CAS lost, a live actor, or nothing read: later */
         :: else ->
              if
              :: obs == recGen && obs != 0 -> owner = me; alive = true                  /* recover */
              :: obs != 0 && obs != recGen ->
#ifdef MUTANT_RETAIN_STALE
                   assert(inv_ends || !QUIET)
#else
                   alloc = RELEASING                                                   /* stale hold: cleaned */
#endif
              :: obs == 0 -> recGen++; owner = me; alive = true;                       /* cas_new_actor */
                   if :: fencedBelow < recGen -> fencedBelow = recGen :: else -> skip fi
              fi
         fi;
         obs = 0; seenGen = 0; wasAlive = false; unread = false }
  /* cleanup (desire: retired): of a releasing allocation, or of a quarantined one whose resolve an operator
     recorded (then with the resolve's release). One attempt's observation, decision and call. */
  :: (alloc == RELEASING && !sentRelease) || (alloc == QUAR && resolveChoice != 0 && !sentResolve) ->
       observe(obs, seenGen, wasAlive, unread);
       atomic {
         wantRes = (alloc == QUAR && resolveChoice != 0);
         if
         :: !((wantRes && !sentResolve) || (!wantRes && alloc == RELEASING && !sentRelease)) || recGen != seenGen -> skip
         :: else ->
              if
              :: unread -> if :: alloc == RELEASING -> alloc = QUAR :: else -> skip fi   /* counted; quarantined after five (one step here) */
              :: !unread && obs == 0 && wasAlive && !recTomb -> skip                     /* a live actor may still hold: wait for its lease */
              :: !unread && obs == 0 && !wasAlive && !recTomb ->                         /* tombstone from the exact record, then release */
                   recGen++; recTomb = true;
                   if :: fencedBelow < recGen -> fencedBelow = recGen :: else -> skip fi;
                   SEND
              :: !unread && obs != 0 && obs != recGen && !recTomb ->
#ifdef MUTANT_RETAIN_STALE
                   assert(inv_ends || !QUIET)
#else
                   SEND
#endif
              :: !unread && !(obs == 0 && !recTomb) && !(obs != 0 && obs != recGen && !recTomb) -> SEND   /* matching hold, or settled */
              fi
         fi;
#ifdef MUTANT_REFUND_EARLY
         if :: sentRelease && alloc == RELEASING -> charged = false; alloc = RELEASED; assert(inv_budget || (!sandbox && heldMask == 0)) :: else -> skip fi
#endif
         obs = 0; seenGen = 0; wasAlive = false; unread = false; wantRes = false }
#ifdef ARM_RESOLVE
  /* the cleanup's release refused (a machine that does not match its record), or its outcome still unknown
     after five tries (in flight; once the agent recorded it, a retry reads the record): quarantined, slot
     and budget charged */
  :: atomic { alloc == RELEASING && sentRelease && !relDone -> alloc = QUAR }
#endif
  /* the proof read (either release's record; an attempt begun before the resolve reads its own), then one
     transaction: the actor record a tombstone, released, slot and budget returned */
  :: atomic { (alloc == RELEASING || alloc == QUAR) && (relDone || (resolveChoice != 0 && resDone)) ->
       if :: relDone -> k = relKept :: resolveChoice != 0 && resDone -> k = resKept fi;
       assert(inv_kept || !k || vol == 1);
       reportedKept = k;
       if :: recGen != 0 && !recTomb -> recGen++; recTomb = true :: else -> skip fi;
#ifdef WITNESS_RESOLVED
       assert(witness || !(alloc == QUAR && agentRestarted && resolveChoice != 0 && resDone));
#endif
#ifdef WITNESS_EXPIRED
       assert(witness || !(byExpiry && vol != 0));
#endif
       refund(); k = false }
  /* the standing push: acknowledged once the agent stored it (a lost push is sent again) */
  :: atomic { cAcked < cEpoch && aEpoch >= cEpoch && !hostDead -> cAcked = cEpoch; assert(inv_no_launch_after_withdraw || aWithdrawn) }
  :: atomic { cAcked < cEpoch && aEpoch < cEpoch && standMsg == 0 -> standMsg = cEpoch }
  od
}

active proctype agent() {
  byte g, h;
  bool k;
  end: do
  /* alloc_hold(g): none held and g at or above the floor, or held by g itself; never after release */
  :: atomic { !hostDead && (holdMsg[1] > 0 || holdMsg[2] > 0 || holdMsg[3] > 0 || holdMsg[4] > 0) ->
       if :: holdMsg[1] > 0 -> g = 1 :: holdMsg[2] > 0 -> g = 2 :: holdMsg[3] > 0 -> g = 3 :: holdMsg[4] > 0 -> g = 4 fi;
       DELIVER(holdMsg[g]);
       if
       :: !released && heldMask == 0 && g >= floor ->
            assert(inv_fenced || !FENCED_CHECKED || g >= fencedBelow);
            heldMask = heldMask | (1 << g)
       :: !released && heldMask == 0 && g < floor -> sawFencedLateHold = true
       :: else -> skip
       fi;
       assert(inv_one_hold || heldMask == 0 || heldMask == 2 || heldMask == 4 || heldMask == 8 || heldMask == 16);
       g = 0 }
  /* alloc_launch(g, epoch): the hold of exactly g, a machine that matches its record, and an epoch the
     withdrawal has not passed; the volume made (or found) */
  :: atomic { !hostDead && (launchMsg[1] > 0 || launchMsg[2] > 0 || launchMsg[3] > 0 || launchMsg[4] > 0) ->
       if :: launchMsg[1] > 0 -> g = 1 :: launchMsg[2] > 0 -> g = 2 :: launchMsg[3] > 0 -> g = 3 :: launchMsg[4] > 0 -> g = 4 fi;
       DELIVER(launchMsg[g]);
       if
       :: launched[g] || launchRefused[g] -> skip                                       /* answered from its record */
       :: else ->
            if
            :: HELD(g) && !released && !mismatch && EPOCH_OK(launchEpoch[g]) ->
                 RAISE(launchEpoch[g]);
                 assert(inv_no_launch_after_withdraw || !(wEpoch > 0 && cAcked >= wEpoch));
                 assert(inv_budget || charged);
                 sandbox = true; machine = true; launched[g] = true;
                 if :: vol == 0 -> vol = 1 :: else -> skip fi
            :: else -> launchRefused[g] = true
            fi
       fi;
       g = 0 }
  /* the restart's alloc_launch(g, epoch) under its own operation id: the same checks as a launch */
  :: atomic { !hostDead && RESTARTS_INFLIGHT > 0 ->
       if :: restartMsg[1] > 0 -> h = 1
#if MAXDEATH >= 2
          :: restartMsg[2] > 0 -> h = 2
#endif
       fi;
       DELIVER(restartMsg[h]);
       g = restartGen[h];
       if
       :: restarted[h] || restartRefused[h] -> skip                                     /* answered from its record */
       :: else ->
            if
            :: HELD(g) && !released && !mismatch && EPOCH_OK(restartEpoch[h]) ->
                 RAISE(restartEpoch[h]);
                 assert(inv_no_launch_after_withdraw || !(wEpoch > 0 && cAcked >= wEpoch));
                 assert(inv_budget || charged);
                 sandbox = true; restarted[h] = true
            :: else -> restartRefused[h] = true
            fi
       fi;
       g = 0; h = 0 }
  /* the cleanup's alloc_release: answered from its record once done; refused (not recorded: a later copy
     acts afresh) while the machine does not match its record */
  :: atomic { !hostDead && relMsg > 0 ->
       DELIVER(relMsg);
       if
       :: relDone -> skip
       :: !relDone && mismatch -> skip
       :: !relDone && !mismatch -> agentRelease(false, relKept); relDone = true
       fi;
       k = false }
  /* the resolve's alloc_release (`resolve`): a mismatched machine is marked resolved and destroyed */
  :: atomic { !hostDead && resMsg > 0 ->
       DELIVER(resMsg);
       if
       :: resDone -> skip
       :: else -> agentRelease(resolveChoice == 2, resKept); resDone = true
       fi;
       k = false }
  /* standing: stored if newer (the acknowledgment waits for launches under way: a launch is one step here) */
  :: atomic { !hostDead && standMsg > 0 ->
       if :: standMsg > aEpoch -> aEpoch = standMsg; aWithdrawn = true :: else -> skip fi;
       standMsg = 0 }
  /* a push lost on the way */
  :: atomic { standMsg > 0 -> standMsg = 0 }
  od
}

active proctype environment() {
  end: do
  /* the actor's lease lapses (its calls in flight still arrive) */
  :: atomic { alive && (lapses < MAXLAPSE || alloc == RELEASING || alloc == QUAR || alloc == RELEASED) -> alive = false; lapses++ }
  /* the owner releases (once) */
  :: atomic { !wantRelease && alloc != RELEASED ->
       wantRelease = true;
       if
       :: alloc == PLACED -> refund()
       :: alloc == LAUNCHING || alloc == READY || alloc == FAILED -> alloc = RELEASING
       :: else -> skip
       fi }
  /* the sandbox dies (killed from outside; its hold, volume and budget stay) */
  :: atomic { sandbox && deaths < MAXDEATH && !hostDead -> sandbox = false; deaths++ }
  /* the operator withdraws the host (once): recorded under a new epoch, then pushed */
  :: atomic { !cWithdrawn ->
       cWithdrawn = true; cEpoch++; wEpoch = cEpoch; standMsg = cEpoch;
#ifdef MUTANT_ACK_UNPUSHED
       cAcked = cEpoch
#endif
     }
#ifdef ARM_EXPIRY
  /* the expiry comes (once; the due handler): the same release transaction as the owner's, cause expiry */
  :: atomic { !expiryCame && alloc != RELEASED ->
       expiryCame = true;
       if
       :: alloc == PLACED -> refund()
#ifdef MUTANT_EXPIRY_UNFENCED
       :: alloc == LAUNCHING -> charged = false; alloc = RELEASED
       :: alloc == READY || alloc == FAILED -> alloc = RELEASING; byExpiry = true
#else
       :: alloc == LAUNCHING || alloc == READY || alloc == FAILED -> alloc = RELEASING; byExpiry = true
#endif
       :: else -> skip
       fi }
#endif
#ifdef ARM_RESOLVE
  /* the agent restarts after the sandbox died: the machine no longer matches its record */
  :: atomic { !agentRestarted && machine && !sandbox && !released && !hostDead -> agentRestarted = true; mismatch = true }
  /* an operator resolves the quarantine (always eventually): the choice recorded, the cleanup due */
  :: atomic { alloc == QUAR && resolveChoice == 0 ->
       if :: resolveChoice = 1 :: resolveChoice = 2 fi;
#ifdef MUTANT_RESOLVE_EARLY
       assert(inv_budget || (!sandbox && !machine && heldMask == 0)); charged = false; alloc = RELEASED
#endif
     }
#endif
#ifdef ARM_HOSTGONE
  /* the host dies for good */
  :: atomic { !hostDead -> hostDead = true }
  /* an operator attests it (standing withdrawn --host-gone): a new epoch, counted acknowledged, no push */
  :: atomic { hostDead && !goneAttested ->
       goneAttested = true; cWithdrawn = true; cEpoch++; cAcked = cEpoch; standMsg = 0;
       if :: wEpoch == 0 -> wEpoch = cEpoch :: else -> skip fi }
  /* alloc resolve --host-gone: one transaction (owner, then host row): a withdrawal acknowledged and attested */
  :: atomic { (alloc == RELEASING || alloc == QUAR) && cWithdrawn && cAcked >= cEpoch && GONE_OK ->
#ifdef WITNESS_HOST_GONE
       assert(witness || !(vol != 0 && hostDead));
#endif
#ifdef MUTANT_GONE_CHARGED
       alloc = RELEASED
#else
       assert(inv_budget || hostDead); charged = false; alloc = RELEASED
#endif
     }
#endif
  /* nothing more can happen: every allocation ended released, its reservation returned */
  :: atomic { timeout -> assert(inv_ends || alloc == RELEASED); assert(inv_budget || !charged);
#ifdef WITNESS_QUIESCENT
       assert(witness);
#endif
       break }
  od
}

init {
  atomic { run coordinator(1); run coordinator(2) }
}
