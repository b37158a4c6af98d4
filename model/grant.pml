/*
 * berth — the portable grant lifecycle as a Promela model, checked
 * exhaustively by SPIN (scripts/check-model.sh, docs/protocol-model.md).
 *
 * One machine, NB borrows (each borrow is issued at the next generation, so a
 * borrow is named by its generation 1..NB), an abstract clock 0..TMAX, and
 * three parties:
 *
 *   coordinator  durable store (machine row, grant rows, operation rows) +
 *                memory that a crash loses (replies in flight to it);
 *                every atomic step below is one store transaction or one
 *                provider call, never both.
 *   agent        key store (keys, current generation, removal tombstones,
 *                operation records: durable) + SSH sessions (die with it);
 *                enforces expiry on its own clock.
 *   environment  the clock, borrowers' SSH logins, and faults: lost /
 *                duplicated / delayed (unordered) operations and replies,
 *                operation failure, crash + restart of the coordinator and
 *                of the agent. (Borrowers' API calls -- borrow, ack,
 *                heartbeat, return -- and token revocation are coordinator
 *                transactions.)
 *
 * Invariants 1-6 of PRODUCT.md are assertions: a blocked monitor process
 * that fires in any reachable state where one breaks, plus assertions at the
 * two decisive edges (activation, return to ready). Each assertion names its
 * invariant through a `hidden` bit that is always 0, so SPIN's report says
 * which one broke: "assertion violated (inv4_no_old_key||...)".
 *
 * Machine edges are annotated  @edge <event> <from>-><to>  ; the test
 * test/model/spin.test.ts replays every annotation through
 * machineTransition (src/core/machine.ts) so the model cannot drift from it.
 *
 * Mutants (deliberate bugs SPIN must catch): compile with -DMUTANT_<NAME>;
 * the list, with the assertion each one trips, is in scripts/check-model.sh.
 */

#ifndef NB
#define NB 2            /* borrows = generations 1..NB */
#endif
#ifndef TMAX
#define TMAX 3          /* the clock runs 0..TMAX */
#endif
#define TTL TMAX        /* machine hard TTL: every grant ends by then */
#define MAXDUR 2        /* the 30-minute cap, in clock units */
#define ACKWIN 1        /* acknowledgement window */
#define HBWIN 1         /* heartbeat interval */

/* Validity of a deadline at time t. Expiry is exclusive: at t == e the grant
 * (key, session) is already expired, everywhere. The mutant flips it. */
#ifdef MUTANT_EXPIRY_INCLUSIVE
#define LIVE(t, e) ((t) <= (e))
#else
#define LIVE(t, e) ((t) < (e))
#endif
/* The agent's own check (keys, sessions), independent of the coordinator's. */
#if defined(MUTANT_EXPIRY_INCLUSIVE) || defined(MUTANT_AGENT_EXPIRY_INCLUSIVE)
#define ALIVE(t, e) ((t) <= (e))
#elif defined(MUTANT_NO_AGENT_EXPIRY)
#define ALIVE(t, e) (1)          /* BUG: the agent leaves expiry to the coordinator's cleanup */
#else
#define ALIVE(t, e) ((t) < (e))
#endif

#define BIT(g)     (1 << (g))
#define HAS(m, g)  ((((m) >> (g)) & 1) == 1)
#define UPTO(g)    (BIT((g) + 1) - 2)      /* bits 1..g */

/* machine states: MachineState in src/core/machine.ts */
#define M_READY        1
#define M_RESERVED     2
#define M_INSTALLING   3
#define M_BUSY         4
#define M_REVOKING     5
#define M_FENCING      6
#define M_SCRUBBING    7
#define M_QUARANTINED  8
#define M_DRAINING     9
#define M_DESTROYING  10
#define M_DESTROYED   11

/* grant states: pending -> installing -> active -> invalidated -> revoked -> fenced -> closed */
#define G_NONE         0   /* not issued yet */
#define G_PENDING      1
#define G_INSTALLING   2
#define G_ACTIVE       3
#define G_INVALIDATED  4
#define G_REVOKED      5
#define G_FENCED       6
#define G_CLOSED       7

#define GLIVE(s) ((s) == G_PENDING || (s) == G_INSTALLING || (s) == G_ACTIVE)

/* ---------------- coordinator: durable store ---------------- */
byte mstate = M_READY;
byte mgen = 0;                 /* machine generation, advanced on every reservation */
byte gstate[NB + 1];
byte gexp[NB + 1];             /* expiresAt, fixed at issue */
byte gack[NB + 1];             /* acknowledgement deadline */
bit  gauth[NB + 1];            /* borrower's token still valid (revocation clears it) */
byte hbdl;                     /* heartbeat deadline of the current grant */
byte iexp[NB + 1];             /* expiresAt carried by the install operation row */
/* coordinator: memory and liveness */
bit  cup = 1;
#ifdef MUTANT_SPLIT_RETURN_TX
byte closeLater;               /* the grant close, deferred to a second transaction */
#endif

/* ---------------- operations and replies in flight (unordered; bit g = generation g) ---------------- */
byte opInstall, opRemove, opFence, opScrub;
bit  opDestroy;
byte rInstalled, rRemoved, rFenced, rScrubbed, rFailed;
bit  rDestroyed;

/* ---------------- agent ---------------- */
bit  aup = 1;
bit  adestroyed;               /* sandbox destroyed (destruction evidence given) */
byte agen;                     /* the agent's current generation of the machine (durable, only grows) */
byte akey;                     /* generation of the installed key, 0 = none (durable) */
byte akexp[NB + 1];            /* expiresAt of the key / sessions of generation g (durable) */
byte atomb;                    /* removal tombstones: removed_keys (durable) */
byte adone;                    /* install operation records: done (durable) */
byte asess;                    /* live SSH sessions, by the generation of the key that opened them */

/* ---------------- environment ---------------- */
byte now;
#ifndef FAULTS
#define FAULTS 2        /* faults of any kind per run: loss, duplicate, failure, crash */
#endif
byte faults = FAULTS;

/* ---------------- ghosts (observation only; never read by the protocol) ---------------- */
byte gexp0[NB + 1];            /* expiresAt as issued */
bit  dead[NB + 1];             /* the grant was invalidated (sticky) */
byte keyGone;                  /* physically removed keys: remove_key executed / sandbox destroyed (sticky) */
byte fencedGen;                /* highest generation whose fence the agent executed */
byte scrubGen;                 /* highest generation whose scrub the agent executed */
byte installOps[NB + 1];       /* distinct install operations (operation ids) issued per generation */

/* assertion names (always 0, not part of the state vector) */
hidden byte inv1_one_grant, inv1_ready_clean;
hidden byte inv2_confirmed_by_provider, inv2_revalidated_unexpired;
hidden byte inv3_expires_at_immutable, inv3_expired_at_equality;
hidden byte inv4_exact_generation, inv4_no_old_key, inv4_no_blind_reinstall;
hidden byte inv5_removed_fenced_scrubbed;
hidden byte inv6_ready_only_via_cleanup, inv6_no_revival;

/* Witnesses (-DWITNESS_<NAME>): an assertion that fails when the model reaches a
 * scenario, to show the checked state space is not vacuous; each must be reached. */
hidden byte witness_reuse, witness_session, witness_stale_completion, witness_duplicate_completion;
hidden byte witness_install_refused, witness_expiry_cut_while_down, witness_restart_resumes_cleanup;
hidden byte witness_quarantine_destroyed;
#ifdef WITNESS_RESTART_RESUMES_CLEANUP
bit crashedInCleanup;
#endif
#ifdef WITNESS_QUARANTINE_DESTROYED
bit wasQuarantined;
#endif

hidden byte g, i, cur;              /* scratch, always written before read inside one atomic step */

/* the run is over once the machine is destroyed (nothing can act on it any more) */
#define RUN (mstate != M_DESTROYED)
#define COORD (cup && RUN)       /* the coordinator can act */

/* the agent lets key g open a session at time now */
#define AUTH(k) (aup && !adestroyed && akey == (k) && (k) != 0 && ALIVE(now, akexp[k]))

#define NC(b) ((gstate[b] != G_NONE && gstate[b] != G_CLOSED) -> 1 : 0)
#if NB > 2
#define NONCLOSED (NC(1) + NC(2) + NC(3))
#else
#define NONCLOSED (NC(1) + NC(2))
#endif

/* per-generation invariant bodies */
#define EXPIRY_OK(b)   ((!HAS(asess, b) || now < gexp0[b]) && (!AUTH(b) || now < gexp0[b]))
#define IMMUTABLE_OK(b) (gexp[b] == gexp0[b])
#define REVIVAL_OK(b)  (!dead[b] || !GLIVE(gstate[b]))
#define ONEINSTALL_OK(b) (installOps[b] <= 1)
#if NB > 2
#define ALL(P) (P(1) && P(2) && P(3))
#else
#define ALL(P) (P(1) && P(2))
#endif

#define INV1A (inv1_one_grant || NONCLOSED <= 1)
#define INV1B (inv1_ready_clean || mstate != M_READY || (akey == 0 && asess == 0))
#define INV3A (inv3_expires_at_immutable || (ALL(IMMUTABLE_OK) && (akey == 0 || akexp[akey] == gexp0[akey])))
#define INV3B (inv3_expired_at_equality || ALL(EXPIRY_OK))
#define INV4A (inv4_no_old_key || akey == 0 || (!HAS(keyGone, akey) && gstate[akey] != G_CLOSED))
#define INV4B (inv4_no_blind_reinstall || ALL(ONEINSTALL_OK))
#define INV6A (inv6_no_revival || ALL(REVIVAL_OK))

/* Checked in every reachable state: the monitor is enabled only when one breaks. */
active proctype monitor()
{
end:
  atomic {
    if
    :: !INV1A -> assert(INV1A)
    :: !INV1B -> assert(INV1B)
    :: !INV3A -> assert(INV3A)
    :: !INV3B -> assert(INV3B)
    :: !INV4A -> assert(INV4A)
    :: !INV4B -> assert(INV4B)
    :: !INV6A -> assert(INV6A)
    fi
  }
}

/* ---------------- helpers ---------------- */

/* choose any message in flight in `mask` (delivery order is arbitrary: delay) */
inline pick(mask)
{
  if
  :: HAS(mask, 1) -> g = 1
  :: HAS(mask, 2) -> g = 2
#if NB > 2
  :: HAS(mask, 3) -> g = 3
#endif
  fi
}

/* take message g out of `mask`, or (once) leave it in flight to be delivered again */
inline consume(mask)
{
  if
  :: faults > 0 -> faults--; printf("      (fault: message g%d duplicated, delivered again later)\n", g)
  :: true -> mask = mask & ~BIT(g)
  fi
}

/* durable invalidation of the current grant, before any remote cleanup */
inline invalidate(b)
{
  gstate[b] = G_INVALIDATED;
  dead[b] = 1;
  printf("t=%d grant g%d invalidated\n", now, b)
}

/* cleanup edges: the transaction writes the next operation row; the executor sends it after commit */
inline to_revoking()  { mstate = M_REVOKING;  opRemove = opRemove | BIT(mgen) }
inline to_fencing()   { mstate = M_FENCING;   opFence  = opFence  | BIT(mgen) }
inline to_scrubbing() { mstate = M_SCRUBBING; opScrub  = opScrub  | BIT(mgen) }

/* failure or doubt: the machine is quarantined, then destroyed; never ready */
inline quarantine()
{
  /* @edge quarantine reserved->quarantined */
  /* @edge quarantine installing->quarantined */
  /* @edge quarantine busy->quarantined */
  /* @edge quarantine revoking->quarantined */
  /* @edge quarantine fencing->quarantined */
  /* @edge quarantine scrubbing->quarantined */
  mstate = M_QUARANTINED;
  printf("t=%d machine quarantined (g%d)\n", now, mgen);
#ifdef WITNESS_QUARANTINE_DESTROYED
  wasQuarantined = 1
#else
  skip
#endif
}

/* grant b becomes active on a provider confirmation carrying generation cg (0: none) */
inline activate(b, cg)
{
  assert(inv2_confirmed_by_provider || cg != 0);
  assert(inv4_exact_generation || (cg == b && akey == b));
  assert(inv2_revalidated_unexpired || (gauth[b] && now < gexp0[b] && gstate[b] == G_INSTALLING));
#ifdef WITNESS_REUSE
  assert(witness_reuse || b != NB);       /* the last borrow active: the machine went round */
#endif
  gstate[b] = G_ACTIVE;
  printf("t=%d grant g%d ACTIVE (confirmation for g%d), expiresAt %d\n", now, b, cg, gexp[b]);
  /* @edge install_confirmed installing->busy */
  mstate = M_BUSY;
  hbdl = ((now + HBWIN < gexp[b]) -> now + HBWIN : gexp[b])   /* nextHeartbeatDeadline */
}

/* the returned machine of generation b becomes ready again */
inline become_ready(b)
{
  assert(inv6_ready_only_via_cleanup || mstate == M_SCRUBBING);
  assert(inv5_removed_fenced_scrubbed || (HAS(keyGone, b) && fencedGen >= b && scrubGen >= b));
#ifdef WITNESS_RESTART_RESUMES_CLEANUP
  assert(witness_restart_resumes_cleanup || !crashedInCleanup);
#endif
  /* @edge scrubbed scrubbing->ready */
  mstate = M_READY;
  printf("t=%d machine READY again (after g%d)\n", now, b);
#ifdef MUTANT_SPLIT_RETURN_TX
  closeLater = b          /* BUG: the grant is closed by a second transaction */
#else
  gstate[b] = G_CLOSED
#endif
}

/* ================================================================
 * Coordinator: store transactions and provider calls
 * ================================================================ */
active proctype coordinator()
{
end:
  do
  /* ---- issue: reserve the ready machine, generation++, pending grant (POST /v1/pools/{pool}/borrow) ---- */
  :: atomic {
       COORD && mstate == M_READY && mgen < NB && now < TTL ->
       /* Cleanup messages of older generations still in flight are dropped here: from now
        * on the agent refuses them (generation below its own, or a no-op: that generation's
        * key is already removed and it has no session) and the coordinator ignores their
        * replies (generation below the machine's). Install messages are kept: their late
        * arrival is what invariant 4 is about. */
       opRemove = 0; opFence = 0; opScrub = 0;
       rRemoved = 0; rFenced = 0; rScrubbed = 0; rFailed = 0;
       mgen++;
       /* @edge reserve:portable ready->reserved */
       mstate = M_RESERVED;
       gstate[mgen] = G_PENDING;
       gauth[mgen] = 1;
       /* expiresAt = min(now + requested, now + 30 min, hard TTL) */
       if
       :: gexp[mgen] = now + 1
       :: now + MAXDUR <= TTL -> gexp[mgen] = now + MAXDUR
       fi;
       gexp0[mgen] = gexp[mgen];
       gack[mgen] = ((now + ACKWIN < gexp[mgen]) -> now + ACKWIN : gexp[mgen]);
       printf("t=%d issue g%d: machine reserved, expiresAt %d, ack by %d\n", now, mgen, gexp[mgen], gack[mgen])
     }
#ifdef MUTANT_SPLIT_RETURN_TX
  :: atomic { COORD && closeLater != 0 -> gstate[closeLater] = G_CLOSED; closeLater = 0 }
#endif

  /* ---- ack: revalidate, persist install intent (the install_key operation row) ---- */
  :: atomic {
       COORD && mstate == M_RESERVED && gstate[mgen] == G_PENDING && gauth[mgen] &&
           LIVE(now, gack[mgen]) && LIVE(now, gexp[mgen]) ->
       gstate[mgen] = G_INSTALLING;
       /* @edge install_started reserved->installing */
       mstate = M_INSTALLING;
       installOps[mgen]++;              /* one operation id for this generation's install */
       iexp[mgen] = gexp[mgen];
       opInstall = opInstall | BIT(mgen);  /* executor: call the provider after commit */
       printf("t=%d ack g%d: install intent persisted, install_key g%d sent\n", now, mgen, mgen);
#ifdef MUTANT_ACTIVATE_BEFORE_CONFIRM
       activate(mgen, 0)                /* BUG: published before the provider confirmed */
#else
       skip
#endif
     }

  /* ---- executor retry (reply lost, coordinator restarted): the SAME operation id, so the
   *      agent answers from its record instead of installing twice ---- */
  :: atomic {
       COORD && mstate == M_INSTALLING && gstate[mgen] == G_INSTALLING &&
           !HAS(opInstall, mgen) && !HAS(rInstalled, mgen) ->
       opInstall = opInstall | BIT(mgen);
       printf("t=%d executor: install_key g%d retried\n", now, mgen);
#ifdef MUTANT_BLIND_REINSTALL
       installOps[mgen]++               /* BUG: a lost reply answered by a fresh install operation */
#else
       skip
#endif
     }

  /* ---- install completion (executor onDone -> onInstallConfirmed): activate only for exactly
   *      this generation, after store revalidation ---- */
  :: atomic {
       COORD && rInstalled != 0 ->
       pick(rInstalled);
       consume(rInstalled);
       printf("t=%d coordinator: install completion g%d (machine at g%d)\n", now, g, mgen);
#ifdef MUTANT_SKIP_GENERATION_CHECK
       cur = mgen;                      /* BUG: the completion's generation is not compared */
#else
       cur = g;
#endif
       if
       :: cur == mgen && gstate[cur] == G_INSTALLING && mstate == M_INSTALLING ->
#ifdef MUTANT_NO_REVALIDATION
          activate(cur, g)              /* BUG: published without revalidating expiry */
#else
          if
          :: LIVE(now, gexp[cur]) -> activate(cur, g)
          :: else ->                    /* expired meanwhile: invalidated, normal cleanup */
             invalidate(cur);
             to_revoking()
          fi
#endif
       :: cur == mgen && gstate[cur] != G_INSTALLING &&
          (mstate == M_REVOKING || mstate == M_FENCING || mstate == M_SCRUBBING || mstate == M_READY) ->
          /* a late install at the current generation after invalidation: the key may have
           * been installed after its removal -- doubt, so quarantine (never lent with a stray key) */
          /* @edge quarantine ready->quarantined */
          quarantine()
       :: else ->                       /* older generation, or a duplicate: audited, nothing changes */
#ifdef WITNESS_STALE_COMPLETION
          assert(witness_stale_completion || g >= mgen);
#endif
#ifdef WITNESS_DUPLICATE_COMPLETION
          assert(witness_duplicate_completion || !(g == mgen && gstate[g] == G_ACTIVE));
#endif
          skip
       fi
     }

  /* ---- install outcome unknown (timeout, attempts exhausted): ambiguous -> quarantine ---- */
  :: atomic {
       COORD && mstate == M_INSTALLING && gstate[mgen] == G_INSTALLING ->
       printf("t=%d install g%d outcome unknown (timeout)\n", now, mgen);
       invalidate(mgen);
       quarantine()
     }

  /* ---- heartbeat: liveness only; never moves expiresAt ---- */
  :: atomic {
       COORD && gstate[mgen] == G_ACTIVE && LIVE(now, gexp[mgen]) && LIVE(now, hbdl) ->
       hbdl = ((now + HBWIN < gexp[mgen]) -> now + HBWIN : gexp[mgen]);
       printf("t=%d heartbeat g%d: next by %d\n", now, mgen, hbdl);
#ifdef MUTANT_HEARTBEAT_EXTENDS
       if
       :: now + MAXDUR > gexp[mgen] -> gexp[mgen] = now + MAXDUR   /* BUG: renewal by heartbeat */
       :: else -> skip
       fi
#else
       skip
#endif
     }
#ifdef MUTANT_LATE_HEARTBEAT_REVIVES
  :: atomic {
       COORD && mgen > 0 && gstate[mgen] == G_INVALIDATED && mstate == M_QUARANTINED ->
       gstate[mgen] = G_ACTIVE          /* BUG: a late heartbeat revives an abandoned grant */
     }
#endif

  /* ---- reconciler: deadlines (due index) ---- */
  /* ack deadline passed: a pending receipt never silently returns the machine to ready
   * (handleGrantDueRow: 'expired' -> cleanup, 'ack_timeout' -> quarantine) */
  :: atomic {
       COORD && mstate == M_RESERVED && gstate[mgen] == G_PENDING && !LIVE(now, gack[mgen]) ->
       printf("t=%d ack deadline of g%d passed\n", now, mgen);
       invalidate(mgen);
#ifdef MUTANT_ACK_TIMEOUT_READY
       become_ready(mgen)               /* BUG: time alone makes the machine ready */
#else
       if
       :: !LIVE(now, gexp[mgen]) -> to_revoking()
       :: else -> quarantine()
       fi
#endif
     }
  /* expiresAt reached: the active (or still installing) grant is invalidated; normal cleanup */
  :: atomic {
       COORD && ((mstate == M_BUSY && gstate[mgen] == G_ACTIVE) ||
                 (mstate == M_INSTALLING && gstate[mgen] == G_INSTALLING)) && !LIVE(now, gexp[mgen]) ->
       printf("t=%d g%d expired\n", now, mgen);
       invalidate(mgen);
       /* @edge return:portable busy->revoking */
       /* @edge return:portable installing->revoking */
       to_revoking()
     }
  /* heartbeat missed: abandoned -> quarantine */
  :: atomic {
       COORD && mstate == M_BUSY && gstate[mgen] == G_ACTIVE && !LIVE(now, hbdl) ->
       printf("t=%d g%d abandoned (heartbeat missed)\n", now, mgen);
       invalidate(mgen);
       quarantine()
     }
  /* the borrower's token is revoked: its live grants are invalidated in the same transaction
   * (invalidateGrantsOfBorrower), then normal cleanup */
  :: atomic {
       COORD && GLIVE(gstate[mgen]) ->
       printf("t=%d token of g%d revoked\n", now, mgen);
       gauth[mgen] = 0;
       invalidate(mgen);
       /* @edge return:portable reserved->revoking */
       to_revoking()
     }
  /* ---- return (POST /v1/borrows/{id}/return): invalidate durably, then remove the key ---- */
  :: atomic {
       COORD && GLIVE(gstate[mgen]) ->
       printf("t=%d return g%d\n", now, mgen);
       invalidate(mgen);
#ifdef MUTANT_PARALLEL_REMOVE_FENCE
       opFence = opFence | BIT(mgen);   /* BUG: fence sent at once, racing the key removal */
#endif
       to_revoking()
     }

  /* ---- cleanup from durable intent: (re)send idempotent operations while their state holds ---- */
  /* executor retries after a lost reply or a restart: same operation ids, idempotent */
  :: atomic { COORD && mstate == M_REVOKING  && !HAS(opRemove | rRemoved | rFailed, mgen) -> opRemove = opRemove | BIT(mgen) }
  :: atomic { COORD && mstate == M_FENCING   && !HAS(opFence  | rFenced  | rFailed, mgen) -> opFence  = opFence  | BIT(mgen) }
  :: atomic { COORD && mstate == M_SCRUBBING && !HAS(opScrub  | rScrubbed| rFailed, mgen) -> opScrub  = opScrub  | BIT(mgen) }
  :: atomic {
       COORD && (mstate == M_QUARANTINED || mstate == M_DRAINING) ->
       /* @edge destroy_started quarantined->destroying */
       /* @edge destroy_started draining->destroying */
       mstate = M_DESTROYING;
       opDestroy = 1
     }
  :: atomic { COORD && mstate == M_DESTROYING && !opDestroy -> opDestroy = 1 }
  /* forced pool drain: every live grant is invalidated ('drained') and its machine quarantined */
  :: atomic {
       COORD && GLIVE(gstate[mgen]) ->
       printf("t=%d pool drained by force (g%d)\n", now, mgen);
       invalidate(mgen);
       quarantine()
     }
  /* ready near hard TTL: drain */
  :: atomic {
       COORD && mstate == M_READY && now + 1 >= TTL ->
       /* @edge drain ready->draining */
       mstate = M_DRAINING
     }

  /* ---- operation completions: each proves one step, only at the machine's generation ---- */
  :: atomic {
       COORD && rRemoved != 0 ->
       pick(rRemoved);
       consume(rRemoved);
       printf("t=%d coordinator: removed g%d (machine at g%d)\n", now, g, mgen);
       if
       :: mstate == M_REVOKING && g == mgen ->
          gstate[g] = G_REVOKED;
#ifdef MUTANT_READY_WITHOUT_FENCE
          gstate[g] = G_FENCED;
          to_scrubbing()                /* BUG: key removal taken as proof that sessions are gone */
#else
          /* @edge revoked revoking->fencing */
          to_fencing()
#endif
       :: else -> skip
       fi
     }
  :: atomic {
       COORD && rFenced != 0 ->
       pick(rFenced);
       consume(rFenced);
       printf("t=%d coordinator: fenced g%d (machine at g%d)\n", now, g, mgen);
       if
       :: mstate == M_FENCING && g == mgen ->
          gstate[g] = G_FENCED;
          /* @edge fenced fencing->scrubbing */
          to_scrubbing()
       :: else -> skip
       fi
     }
  :: atomic {
       COORD && rScrubbed != 0 ->
       pick(rScrubbed);
       consume(rScrubbed);
       printf("t=%d coordinator: scrubbed g%d (machine at g%d)\n", now, g, mgen);
       if
       :: mstate == M_SCRUBBING && g == mgen -> become_ready(g)
       :: else -> skip
       fi
     }
  :: atomic {
       COORD && rFailed != 0 ->
       pick(rFailed);
       consume(rFailed);
       printf("t=%d coordinator: failed g%d (machine at g%d)\n", now, g, mgen);
       if
       :: (mstate == M_REVOKING || mstate == M_FENCING || mstate == M_SCRUBBING) && g == mgen -> quarantine()
       :: else -> skip
       fi
     }
  :: atomic {
       COORD && rDestroyed ->
       rDestroyed = 0;
       printf("t=%d coordinator: destroyed\n", now);
       if
       :: mstate == M_DESTROYING ->
          /* @edge destroyed destroying->destroyed */
          mstate = M_DESTROYED;
#ifdef WITNESS_QUARANTINE_DESTROYED
          assert(witness_quarantine_destroyed || !wasQuarantined);
#endif
          if
          :: mgen > 0 && gstate[mgen] != G_CLOSED -> gstate[mgen] = G_CLOSED
          :: else -> skip
          fi
       :: else -> skip
       fi
     }

  /* ---- crash: memory and in-flight replies lost; store kept. restart: resume from durable rows ---- */
  :: atomic {
       COORD && faults > 0 ->
       faults--;
       cup = 0;
       printf("t=%d COORDINATOR CRASH\n", now);
#ifdef WITNESS_RESTART_RESUMES_CLEANUP
       crashedInCleanup = (mstate == M_REVOKING || mstate == M_FENCING || mstate == M_SCRUBBING);
#endif
       rInstalled = 0; rRemoved = 0; rFenced = 0; rScrubbed = 0; rFailed = 0; rDestroyed = 0;
#ifdef MUTANT_SPLIT_RETURN_TX
       closeLater = 0
#else
       skip
#endif
     }
  :: atomic {
       !cup && RUN -> cup = 1;
       printf("t=%d coordinator restarts\n", now);
#ifdef MUTANT_VOLATILE_CLEANUP_INTENT
       /* BUG: cleanup progress lived in memory; restart takes a machine in cleanup for a ready one */
       if
       :: mstate == M_REVOKING || mstate == M_FENCING -> become_ready(mgen)
       :: else -> skip
       fi
#else
       skip
#endif
     }
  od
}

/* ================================================================
 * Agent: operations (generation preconditions, op records, tombstones),
 * SSH authentication, expiry enforcement, crash + restart
 * ================================================================ */
active proctype agent()
{
end:
  do
  :: atomic {
       aup && !adestroyed && opInstall != 0 ->
       pick(opInstall);
       consume(opInstall);
       printf("t=%d agent: install_key g%d arrives (agent at g%d)\n", now, g, agen);
       if
       :: HAS(adone, g) -> rInstalled = rInstalled | BIT(g)    /* known op id: first result again, no second act */
#ifdef MUTANT_AGENT_NO_TOMBSTONE
       :: !HAS(adone, g) && g >= agen ->                        /* BUG: removal tombstones not consulted */
#else
       :: !HAS(adone, g) && g >= agen && !HAS(atomb, g) ->
#endif
          if
          :: akey != 0 && akey < g -> asess = asess & ~BIT(akey)  /* superseded: its sessions cut */
          :: else -> skip
          fi;
          agen = g;
          akey = g;
          akexp[g] = iexp[g];
          adone = adone | BIT(g);
          rInstalled = rInstalled | BIT(g)
       :: else ->                                               /* generation_mismatch / removed: refused */
#ifdef WITNESS_INSTALL_REFUSED
          assert(witness_install_refused || !(g >= agen && HAS(atomb, g)));
#endif
          skip
       fi
     }
  :: atomic {
       aup && !adestroyed && opRemove != 0 ->
       pick(opRemove);
       consume(opRemove);
       printf("t=%d agent: remove_key g%d arrives (agent at g%d)\n", now, g, agen);
       if
       :: g >= agen && faults > 0 -> faults--; rFailed = rFailed | BIT(g); printf("      (fault: the operation fails)\n")
       :: g >= agen ->
          agen = g;
          if
          :: akey != 0 && akey <= g -> akey = 0
          :: else -> skip
          fi;
          atomb = atomb | BIT(g);
          keyGone = keyGone | UPTO(g);
          rRemoved = rRemoved | BIT(g)
       :: else -> skip
       fi
     }
  :: atomic {
       aup && !adestroyed && opFence != 0 ->
       pick(opFence);
       consume(opFence);
       printf("t=%d agent: fence g%d arrives (agent at g%d)\n", now, g, agen);
       if
       :: g >= agen && faults > 0 -> faults--; rFailed = rFailed | BIT(g); printf("      (fault: the operation fails)\n")
       :: g >= agen ->
          agen = g;
          asess = 0;                    /* every session reaped (new incarnation) */
          fencedGen = ((fencedGen < g) -> g : fencedGen);
          rFenced = rFenced | BIT(g)
       :: else -> skip
       fi
     }
  :: atomic {
       aup && !adestroyed && opScrub != 0 ->
       pick(opScrub);
       consume(opScrub);
       printf("t=%d agent: scrub g%d arrives (agent at g%d)\n", now, g, agen);
       if
       :: g >= agen && faults > 0 -> faults--; rFailed = rFailed | BIT(g); printf("      (fault: the operation fails)\n")
       :: g >= agen ->
          agen = g;
          scrubGen = ((scrubGen < g) -> g : scrubGen);
          rScrubbed = rScrubbed | BIT(g)
       :: else -> skip
       fi
     }
  :: atomic {
       aup && RUN && opDestroy ->
       opDestroy = 0;
       adestroyed = 1;
       printf("t=%d agent: sandbox destroyed\n", now);
       asess = 0;
       if
       :: akey != 0 -> keyGone = keyGone | BIT(akey); akey = 0
       :: else -> skip
       fi;
       rDestroyed = 1
     }
  /* crash: sessions die, the key store survives; restart sweeps */
  :: atomic {
       aup && RUN && faults > 0 ->
       faults--;
       aup = 0;
       asess = 0;
       printf("t=%d AGENT CRASH (sessions die, key store kept)\n", now);
#ifdef MUTANT_AGENT_VOLATILE_TOMBSTONE
       atomb = 0                        /* BUG: removal tombstones kept in memory only */
#else
       skip
#endif
     }
  :: atomic { !aup && RUN -> aup = 1; printf("t=%d agent restarts\n", now) }
  od
}

/* ================================================================
 * Environment: clock (with the agent's own expiry enforcement),
 * borrowers' SSH logins, token revocation, message loss
 * ================================================================ */
active proctype environment()
{
end:
  do
  /* time passes, also while the coordinator is down; at now >= expiresAt the agent
   * deletes the key and cuts its sessions on its own */
  :: atomic {
       RUN && now < TMAX ->
       now++;
       printf("t=%d ----- tick\n", now);
       if
       :: akey != 0 && !ALIVE(now, akexp[akey]) -> akey = 0
       :: else -> skip
       fi;
       i = 1;
       do
       :: i <= NB ->
          if
          :: HAS(asess, i) && !ALIVE(now, akexp[i]) ->
#ifdef WITNESS_EXPIRY_CUT_WHILE_DOWN
             assert(witness_expiry_cut_while_down || cup);
#endif
             asess = asess & ~BIT(i)
          :: else -> skip
          fi;
          i++
       :: else -> break
       od
     }
  /* the borrower holding key g opens an SSH session through the agent's gateway */
  :: atomic {
       RUN && akey != 0 && !HAS(asess, akey) && AUTH(akey) ->
#ifdef WITNESS_SESSION
       assert(witness_session || gstate[akey] != G_ACTIVE);
#endif
       asess = asess | BIT(akey);
       printf("t=%d borrower g%d opens an SSH session\n", now, akey)
     }
  /* one operation or reply is lost */
  :: atomic {
       RUN && faults > 0 && (opInstall | opRemove | opFence | opScrub | opDestroy |
                        rInstalled | rRemoved | rFenced | rScrubbed | rFailed | rDestroyed) != 0 ->
       faults--;
       if
       :: opInstall  != 0 -> pick(opInstall);  opInstall  = opInstall  & ~BIT(g); printf("      (fault: install_key g%d lost)\n", g)
       :: opRemove   != 0 -> pick(opRemove);   opRemove   = opRemove   & ~BIT(g); printf("      (fault: remove_key g%d lost)\n", g)
       :: opFence    != 0 -> pick(opFence);    opFence    = opFence    & ~BIT(g); printf("      (fault: fence g%d lost)\n", g)
       :: opScrub    != 0 -> pick(opScrub);    opScrub    = opScrub    & ~BIT(g); printf("      (fault: scrub g%d lost)\n", g)
       :: opDestroy       -> opDestroy = 0; printf("      (fault: destroy lost)\n")
       :: rInstalled != 0 -> pick(rInstalled); rInstalled = rInstalled & ~BIT(g); printf("      (fault: install completion g%d lost)\n", g)
       :: rRemoved   != 0 -> pick(rRemoved);   rRemoved   = rRemoved   & ~BIT(g); printf("      (fault: removed reply g%d lost)\n", g)
       :: rFenced    != 0 -> pick(rFenced);    rFenced    = rFenced    & ~BIT(g); printf("      (fault: fenced reply g%d lost)\n", g)
       :: rScrubbed  != 0 -> pick(rScrubbed);  rScrubbed  = rScrubbed  & ~BIT(g); printf("      (fault: scrubbed reply g%d lost)\n", g)
       :: rFailed    != 0 -> pick(rFailed);    rFailed    = rFailed    & ~BIT(g); printf("      (fault: failure reply g%d lost)\n", g)
       :: rDestroyed      -> rDestroyed = 0; printf("      (fault: destroyed reply lost)\n")
       fi
     }
  od
}
