/**
 * Serialises work per key: the runtimes' operations per machine
 * (create/exec-start/fence/scrub/destroy, so a fence never races a
 * half-started command or a second fence) and the agent's operations per
 * machine. A failed task does not block the next one.
 */
export class KeyedLock {
  private readonly tails = new Map<string, Promise<unknown>>();

  /** Runs `fn` after every earlier task on the same key. */
  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }
}
