/*
 * berth-pty-relay: gives a command a real terminal inside a gVisor sandbox.
 *
 * `runsc exec` with "terminal": true hands the command the host's PTY as an
 * imported file: it answers terminal ioctls, but it is no /dev/pts device, so
 * `tty` says "not a tty", ttyname() fails and a shell cannot take it as its
 * controlling terminal (no job control). This relay, exec'd in its place,
 * opens a pseudo-terminal of the sandbox's own devpts, runs the command as the
 * leader of a new session on its slave (controlling terminal, /dev/pts/N), and
 * copies bytes both ways between its stdin/stdout (the host PTY, put in raw
 * mode: the inner terminal does the line discipline) and the master.
 *
 *   - SIGWINCH: the host PTY's size is copied to the inner terminal (whose
 *     kernel then signals the foreground group itself);
 *   - HUP, INT, QUIT, TSTP, TERM, USR1, USR2, CONT: passed on to the inner terminal's
 *     foreground process group (where a keyboard's signal would go; see
 *     pass_signal for gVisor, which does not tell that group);
 *   - the command's end: output still buffered in the terminal is drained,
 *     the host PTY's modes restored, and the relay ends as the command did
 *     (same exit status, or killed by the same signal).
 *
 * Usage: berth-pty-relay COMMAND [ARG...]. Static, no dependencies, so it runs
 * in any image. Built by scripts/build-pty-relay.mjs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

static int sigpipe_fds[2] = {-1, -1};
static struct termios saved;
static int saved_ok = 0;

static void on_signal(int sig) {
  int e = errno;
  unsigned char b = (unsigned char)sig;
  if (write(sigpipe_fds[1], &b, 1) < 0) { /* full: the signal is dropped, as a pending one would be */ }
  errno = e;
}

static void restore(void) {
  if (saved_ok) tcsetattr(0, TCSADRAIN, &saved);
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd q = {fd, POLLOUT, 0};
        poll(&q, 1, -1);
        continue;
      }
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/*
 * Pass a signal on to the foreground group. Where the group cannot be asked
 * (gVisor), INT, QUIT and TSTP are typed as the terminal's own INTR, QUIT or SUSP character
 * (with ISIG on, the terminal signals its foreground group, exactly as a
 * keyboard does); other signals go to the command's group.
 */
static void pass_signal(int master, int slave, pid_t child, int sig) {
  pid_t fg = tcgetpgrp(master);
  if (fg <= 0) fg = tcgetpgrp(slave);
  if (fg > 0) {
    kill(-fg, sig);
    return;
  }
#ifdef TIOCSIG
  /* Linux's own way to signal the slave's foreground group from the master. */
  if (ioctl(master, TIOCSIG, sig) == 0) return;
#endif
  struct termios t;
  if ((sig == SIGINT || sig == SIGQUIT || sig == SIGTSTP) && tcgetattr(slave, &t) == 0 && (t.c_lflag & ISIG)) {
    cc_t c = t.c_cc[sig == SIGINT ? VINTR : sig == SIGQUIT ? VQUIT : VSUSP];
    if (c != _POSIX_VDISABLE) {
      /* A signal, not a keystroke: input already typed ahead is kept (NOFLSH while it is typed). */
      struct termios keep = t;
      keep.c_lflag |= NOFLSH;
      int set = !(t.c_lflag & NOFLSH) && tcsetattr(slave, TCSANOW, &keep) == 0;
      ssize_t w = write(master, &c, 1);
      if (set) tcsetattr(slave, TCSANOW, &t);
      if (w == 1) return;
    }
  }
  kill(-child, sig);
}

static void copy_size(int master) {
  struct winsize ws;
  if (ioctl(0, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) ioctl(master, TIOCSWINSZ, &ws);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: berth-pty-relay COMMAND [ARG...]\n");
    return 2;
  }
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
    /* No devpts here: run the command on the terminal we were given. */
    execvp(argv[1], argv + 1);
    fprintf(stderr, "berth-pty-relay: %s: %s\n", argv[1], strerror(errno));
    return errno == ENOENT ? 127 : 126;
  }
  char *slave_name = ptsname(master);
  if (!slave_name) {
    perror("berth-pty-relay: ptsname");
    return 126;
  }
  slave_name = strdup(slave_name);
  /*
   * The relay holds the slave open too: without it the master reports hang-up
   * (EIO) until the child has opened its side, and again as soon as the command
   * ends; the end is taken from the child's exit instead (SIGCHLD).
   */
  int slave = open(slave_name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) {
    fprintf(stderr, "berth-pty-relay: %s: %s\n", slave_name, strerror(errno));
    return 126;
  }
  if (isatty(0)) {
    struct termios t;
    if (tcgetattr(0, &saved) == 0) {
      saved_ok = 1;
      /* The inner terminal starts with the outer one's modes (as ssh's PTY request set them). */
      t = saved;
      tcsetattr(master, TCSANOW, &t);
      cfmakeraw(&t);
      tcsetattr(0, TCSADRAIN, &t);
    }
  }
  copy_size(master);
  if (pipe2(sigpipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    perror("berth-pty-relay: pipe");
    restore();
    return 126;
  }
  /* The relay itself never stops on terminal signals (TSTP is caught and passed on). */
  signal(SIGTTIN, SIG_IGN);
  signal(SIGTTOU, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  const int passed[] = {SIGHUP, SIGINT, SIGQUIT, SIGTSTP, SIGTERM, SIGUSR1, SIGUSR2, SIGCONT, SIGWINCH, SIGCHLD};
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (size_t i = 0; i < sizeof passed / sizeof passed[0]; i++) sigaction(passed[i], &sa, NULL);

  pid_t child = fork();
  if (child < 0) {
    perror("berth-pty-relay: fork");
    restore();
    return 126;
  }
  if (child == 0) {
    for (size_t i = 0; i < sizeof passed / sizeof passed[0]; i++) signal(passed[i], SIG_DFL);
    signal(SIGTTIN, SIG_DFL);
    signal(SIGTTOU, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    setsid();
    int s = slave;
    if (ioctl(s, TIOCSCTTY, 0) != 0) {
      fprintf(stderr, "berth-pty-relay: %s: controlling terminal: %s\r\n", slave_name, strerror(errno));
      _exit(126);
    }
    dup2(s, 0);
    dup2(s, 1);
    dup2(s, 2);
    if (s > 2) close(s);
    close(master);
    execvp(argv[1], argv + 1);
    int e = errno;
    fprintf(stderr, "berth-pty-relay: %s: %s\r\n", argv[1], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
  }

  int status = 0;
  int done = 0;
  int in_open = 1;
  char buf[16384];
  for (;;) {
    struct pollfd fds[3] = {{sigpipe_fds[0], POLLIN, 0}, {master, POLLIN, 0}, {0, in_open ? POLLIN : 0, 0}};
    /* Once the command has ended, output still in the terminal is drained until it goes quiet. */
    int r = poll(fds, in_open && !done ? 3 : 2, done ? 50 : -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    /*
     * After the command's end everything it wrote is already in the terminal:
     * drained until nothing is readable for 50 ms, however long the reader
     * takes (its backpressure blocks the writes above, never drops bytes).
     */
    if (done && r == 0) break;
    if (fds[0].revents & POLLIN) {
      unsigned char sigs[64];
      ssize_t n = read(sigpipe_fds[0], sigs, sizeof sigs);
      for (ssize_t i = 0; i < n; i++) {
        int sig = sigs[i];
        if (sig == SIGCHLD) {
          if (!done && waitpid(child, &status, WNOHANG) == child) done = 1;
        } else if (sig == SIGWINCH) {
          copy_size(master);
        } else if (!done) {
          pass_signal(master, slave, child, sig);
        }
      }
    }
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = read(master, buf, sizeof buf);
      if (n > 0) {
        if (write_all(1, buf, (size_t)n) != 0 && !done) { /* the reader is gone: keep draining so the command is not blocked */ }
      } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        /* EIO: no slave open any more. */
        if (done) break;
        if (waitpid(child, &status, 0) == child) done = 1;
        break;
      }
    }
    if (in_open && !done && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = read(0, buf, sizeof buf);
      if (n > 0) write_all(master, buf, (size_t)n);
      else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) in_open = 0;
    }
  }
  if (!done) waitpid(child, &status, 0);
  restore();
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t m;
    sigemptyset(&m);
    sigaddset(&m, sig);
    sigprocmask(SIG_UNBLOCK, &m, NULL);
    kill(getpid(), sig);
    return 128 + sig;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
