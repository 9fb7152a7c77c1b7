/* The pod sandbox's process: holds the pod's namespaces open and sleeps until told to stop.
 * Built static (gcc -static) so its image holds this one file; stands in for registry.k8s.io/pause,
 * which cannot be pulled here. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(128 + sig); }

/* Reaps children, in case the pod shares its PID namespace and this is its PID 1. */
static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGINT, stop);
  signal(SIGTERM, stop);
  signal(SIGCHLD, reap);
  for (;;) pause();
}
