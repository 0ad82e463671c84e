/**
 * A circuit breaker: after `failures` calls in a row that found Spillway unavailable (a
 * network error, a timeout, a 5xx), stop calling it for `periodMs`; then let one trial call
 * through, whose success closes the breaker and whose failure opens it again.
 *
 * While Spillway hangs, each call would otherwise wait out the whole timeout; with the breaker
 * a hung Spillway costs one timeout per period, and every other check is answered at once (as
 * the failure mode says). Pure bookkeeping: no I/O, time from `clock`.
 */

/** The breaker answered instead of Spillway; the message says why. */
export class BreakerOpen extends Error {
  constructor(message: string) {
    super(message);
    this.name = "BreakerOpen";
  }
}

export class Breaker {
  private inARow = 0;
  private last = "";
  private openUntil: number | undefined;
  private trial = false;

  constructor(
    readonly failures: number,
    readonly periodMs: number,
    private readonly clock: () => number = () => performance.now(),
  ) {
    if (!Number.isInteger(failures) || failures < 1) throw new TypeError("breaker.failures must be an integer of at least 1 (or breaker: false)");
    if (!(periodMs > 0)) throw new TypeError("breaker.periodMs must be more than 0");
  }

  get isOpen(): boolean {
    return this.openUntil !== undefined;
  }

  /** Before a call: throws BreakerOpen when the call must not be made; true when the call is
   * the trial that decides whether the breaker closes. */
  enter(): boolean {
    if (this.openUntil === undefined) return false;
    const why = `circuit breaker open after ${this.inARow} failures in a row (the last: ${this.last})`;
    const left = this.openUntil - this.clock();
    if (left > 0) throw new BreakerOpen(`${why}; not calling Spillway for another ${(left / 1000).toFixed(1)} s`);
    if (this.trial) throw new BreakerOpen(`${why}; a trial call is under way`);
    this.trial = true;
    return true;
  }

  /** Spillway answered (anything but a 5xx). True when that closed the breaker. */
  succeeded(): boolean {
    const wasOpen = this.openUntil !== undefined;
    this.inARow = 0;
    this.openUntil = undefined;
    this.trial = false;
    return wasOpen;
  }

  /** Spillway was unavailable for a call. True when that opened the breaker (the Nth failure
   * in a row, or the trial's). */
  failed(trial: boolean, reason: string): boolean {
    this.inARow += 1;
    this.last = reason;
    if (trial) {
      this.trial = false;
    } else if (this.openUntil !== undefined || this.inARow < this.failures) {
      // A call made before the breaker opened, failing late, does not extend it.
      return false;
    }
    this.openUntil = this.clock() + this.periodMs;
    return true;
  }

  /** The call ended with neither (a bug while reading its answer): the next call may be the trial. */
  abandoned(trial: boolean): void {
    if (trial) this.trial = false;
  }
}
