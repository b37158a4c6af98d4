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
 *                       agent proved the cleanup (no sandbox, no hold);
 *   inv_ends            no decision keeps the obligation (retain) when
 *                       nothing else can change the outcome (no live actor,
 *                       no call in flight): every allocation goes on to
 *                       ready or released.
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
 * Not modelled: an unreadable agent (retain, quarantine after five tries:
 * unit- and end-to-end tested), an agent restart that leaves the machine
 * not matching its record (the agent refuses the restart: end-to-end
 * tested), several allocations on one host, expiry (a release by another
 * cause).
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

bit inv_one_hold, inv_fenced, inv_no_launch_after_withdraw, inv_budget, inv_ends, witness;

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
byte cAcked = 0;            /* the epoch the agent acknowledged */
byte wEpoch = 0;            /* the withdrawal's epoch (0: none) */
byte fencedBelow = 0;       /* highest generation decided on an "absent" observation (for inv_fenced) */
bool sentHold[6];
bool sentLaunch[6];
bool sentRelease;
byte restarts = 0;          /* restarts requested so far (the current one's index) */
bool restartWanted;         /* the current restart requested, its drive not yet run */
bool restartSent[R];

/* ---- agent store ---- */
byte heldMask = 0;          /* generations whose hold is live (bit g) */
byte floor = 0;             /* the hold's floor (`fenced`) */
bool released;              /* the hold released for good */
byte aEpoch = 0;            /* the standing epoch the agent stored */
bool aWithdrawn;
bool sandbox;               /* the allocation's sandbox runs */
bool launched[6];
bool launchRefused[6];
bool relDone;
bool restarted[R];          /* the agent's record of each restart operation: started ... */
bool restartRefused[R];     /* ... or refused */

/* ---- calls in flight (a bag: any order, any delay) ---- */
byte holdMsg[6];
byte launchMsg[6];
byte launchEpoch[6];
byte relMsg;
byte restartMsg[R];
byte restartGen[R];
byte restartEpoch[R];
byte standMsg;              /* the epoch a standing push carries (0: none in flight) */
byte dups, lapses, deaths;
bool wantRelease;
bool sawFencedLateHold;

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
#define INFLIGHT (holdMsg[1] + holdMsg[2] + holdMsg[3] + holdMsg[4] + launchMsg[1] + launchMsg[2] + launchMsg[3] + launchMsg[4] + relMsg + RESTARTS_INFLIGHT > 0)
#define QUIET (!alive && !INFLIGHT)

inline refund() {
  assert(inv_budget || (!sandbox && heldMask == 0 && (relDone || (recGen == 0))));
  charged = false; alloc = RELEASED
}

/* The observation a replacement (or the cleanup) decides on. It raises the floor when no hold is held and
   the prior actor may not act any more (core/allocation-takeover.ts fenceFloor). The decision uses the
   standing read here (the code reads the lease before it observes and decides on both). */
inline observe(obs, seenGen, wasAlive) {
  atomic {
    seenGen = recGen; wasAlive = alive;
#ifndef MUTANT_NO_FLOOR
    if
    :: heldMask == 0 && !released && !alive && !recTomb && floor < recGen + 1 -> floor = recGen + 1
    :: else -> skip
    fi;
#endif
    HOLDOF(obs)
  }
}

proctype coordinator(byte me) {
  byte obs, seenGen, g;
  bool wasAlive;
  end: do
  /* decide: the first actor (generation 1), or a withdrawn host's placed allocation released at once */
  :: atomic { alloc == PLACED && recGen == 0 ->
       if
       :: cWithdrawn -> refund()
       :: else -> recGen = 1; owner = me; alive = true; alloc = LAUNCHING
       fi }
  /* the actor: hold */
  :: atomic { alloc == LAUNCHING && owner == me && alive && !recTomb && !sentHold[recGen] ->
       sentHold[recGen] = true; holdMsg[recGen]++ }
  /* the actor: gate (standing, under the host row), then launch with the epoch decided under */
  :: atomic { alloc == LAUNCHING && owner == me && alive && !recTomb && HELD(recGen) && !sentLaunch[recGen] ->
       sentLaunch[recGen] = true;
       if
       :: cWithdrawn -> alloc = RELEASING
       :: else -> launchMsg[recGen]++; launchEpoch[recGen] = cEpoch
       fi }
  /* the actor: the launch's result recorded (only while the record is its own) */
  :: atomic { alloc == LAUNCHING && owner == me && !recTomb && launched[recGen] ->
       alloc = READY;
#ifdef WITNESS_READY_AFTER_TAKEOVER
       assert(witness || !(recGen >= 2 && sawFencedLateHold))
#endif
     }
  :: atomic { alloc == LAUNCHING && owner == me && !recTomb && launchRefused[recGen] -> alloc = RELEASING }
  /* the watch: the agent says the sandbox is not running -> failed (one observation, then one transaction
     under the owner's lock that moves only a ready allocation; nothing in between moves a ready one back) */
  :: atomic { alloc == READY && !sandbox -> alloc = FAILED }
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
       observe(obs, seenGen, wasAlive);
       atomic {
         if
         :: alloc != LAUNCHING || recGen != seenGen || wasAlive || alive || recTomb -> skip   /* the CAS lost (or a live actor): decide again later */
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
         fi }
  /* cleanup (desire: retired) */
  :: alloc == RELEASING && !sentRelease ->
       observe(obs, seenGen, wasAlive);
       atomic {
         if
         :: alloc != RELEASING || recGen != seenGen || sentRelease -> skip
         :: obs == 0 && wasAlive && !recTomb -> skip                                   /* a live actor may still hold: wait for its lease */
         :: obs == 0 && !wasAlive && !recTomb ->                                          /* tombstone from the exact record, then release */
              recGen++; recTomb = true;
              if :: fencedBelow < recGen -> fencedBelow = recGen :: else -> skip fi;
              sentRelease = true; relMsg++
         :: obs != 0 && obs != recGen && !recTomb ->
#ifdef MUTANT_RETAIN_STALE
              assert(inv_ends || !QUIET)
#else
              sentRelease = true; relMsg++
#endif
         :: else -> sentRelease = true; relMsg++                                       /* matching hold, or settled */
         fi;
#ifdef MUTANT_REFUND_EARLY
         if :: sentRelease && alloc == RELEASING -> charged = false; alloc = RELEASED; assert(inv_budget || (!sandbox && heldMask == 0)) :: else -> skip fi
#endif
       }
  :: atomic { alloc == RELEASING && relDone -> refund() }
  /* the standing push: acknowledged once the agent stored it (a lost push is sent again) */
  :: atomic { cAcked < cEpoch && aEpoch >= cEpoch -> cAcked = cEpoch; assert(inv_no_launch_after_withdraw || aWithdrawn) }
  :: atomic { cAcked < cEpoch && aEpoch < cEpoch && standMsg == 0 -> standMsg = cEpoch }
  od
}

active proctype agent() {
  byte g, h;
  bool dup;
  end: do
  /* alloc_hold(g): none held and g at or above the floor, or held by g itself; never after release */
  :: atomic { (holdMsg[1] > 0 || holdMsg[2] > 0 || holdMsg[3] > 0 || holdMsg[4] > 0) ->
       if :: holdMsg[1] > 0 -> g = 1 :: holdMsg[2] > 0 -> g = 2 :: holdMsg[3] > 0 -> g = 3 :: holdMsg[4] > 0 -> g = 4 fi;
       if :: dups < MAXDUP -> dups++ :: holdMsg[g]-- fi;
       if
       :: !released && heldMask == 0 && g >= floor ->
            assert(inv_fenced || !FENCED_CHECKED || g >= fencedBelow);
            heldMask = heldMask | (1 << g)
       :: !released && heldMask == 0 && g < floor -> sawFencedLateHold = true
       :: else -> skip
       fi;
       assert(inv_one_hold || heldMask == 0 || heldMask == 2 || heldMask == 4 || heldMask == 8 || heldMask == 16) }
  /* alloc_launch(g, epoch): the hold of exactly g, and an epoch the withdrawal has not passed */
  :: atomic { (launchMsg[1] > 0 || launchMsg[2] > 0 || launchMsg[3] > 0 || launchMsg[4] > 0) ->
       if :: launchMsg[1] > 0 -> g = 1 :: launchMsg[2] > 0 -> g = 2 :: launchMsg[3] > 0 -> g = 3 :: launchMsg[4] > 0 -> g = 4 fi;
       if :: dups < MAXDUP -> dups++ :: launchMsg[g]-- fi;
       if
       :: launched[g] || launchRefused[g] -> skip                                       /* answered from its record */
       :: else ->
            if
            :: HELD(g) && !released && EPOCH_OK(launchEpoch[g]) ->
                 RAISE(launchEpoch[g]);
                 assert(inv_no_launch_after_withdraw || !(wEpoch > 0 && cAcked >= wEpoch));
                 assert(inv_budget || charged);
                 sandbox = true; launched[g] = true
            :: else -> launchRefused[g] = true
            fi
       fi }
  /* the restart's alloc_launch(g, epoch) under its own operation id: the same checks as a launch */
  :: atomic { RESTARTS_INFLIGHT > 0 ->
       if :: restartMsg[1] > 0 -> h = 1
#if MAXDEATH >= 2
          :: restartMsg[2] > 0 -> h = 2
#endif
       fi;
       if :: dups < MAXDUP -> dups++ :: restartMsg[h]-- fi;
       g = restartGen[h];
       if
       :: restarted[h] || restartRefused[h] -> skip                                     /* answered from its record */
       :: else ->
            if
            :: HELD(g) && !released && EPOCH_OK(restartEpoch[h]) ->
                 RAISE(restartEpoch[h]);
                 assert(inv_no_launch_after_withdraw || !(wEpoch > 0 && cAcked >= wEpoch));
                 assert(inv_budget || charged);
                 sandbox = true; restarted[h] = true
            :: else -> restartRefused[h] = true
            fi
       fi }
  /* alloc_release: sandbox destroyed, hold released for good (fences every later hold) */
  :: atomic { relMsg > 0 ->
       if :: dups < MAXDUP -> dups++ :: relMsg-- fi;
       sandbox = false; heldMask = 0; released = true; relDone = true }
  /* standing: stored if newer (the acknowledgment waits for launches under way: a launch is one step here) */
  :: atomic { standMsg > 0 ->
       if :: standMsg > aEpoch -> aEpoch = standMsg; aWithdrawn = true :: else -> skip fi;
       standMsg = 0 }
  /* a push lost on the way */
  :: atomic { standMsg > 0 -> standMsg = 0 }
  od
}

active proctype environment() {
  end: do
  /* the actor's lease lapses (its calls in flight still arrive) */
  :: atomic { alive && (lapses < MAXLAPSE || alloc == RELEASING) -> alive = false; lapses++ }
  /* the owner releases (once) */
  :: atomic { !wantRelease && alloc != RELEASED ->
       wantRelease = true;
       if
       :: alloc == PLACED -> refund()
       :: alloc == LAUNCHING || alloc == READY || alloc == FAILED -> alloc = RELEASING
       :: else -> skip
       fi }
  /* the sandbox dies (killed from outside; its hold, volume and budget stay) */
  :: atomic { sandbox && deaths < MAXDEATH -> sandbox = false; deaths++ }
  /* the operator withdraws the host (once): recorded under a new epoch, then pushed */
  :: atomic { !cWithdrawn ->
       cWithdrawn = true; cEpoch++; wEpoch = cEpoch; standMsg = cEpoch;
#ifdef MUTANT_ACK_UNPUSHED
       cAcked = cEpoch
#endif
     }
  od
}

init {
  atomic { run coordinator(1); run coordinator(2) }
}
