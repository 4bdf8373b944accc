/*
 * helper_call.c: see helper_call.h.
 */
#include "process/helper_call.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "process/privilege.h"

char *
helper_call_path(const char *configured, const char *name)
{
	char	self[PATH_MAX];
	ssize_t n;
	char   *slash;

	if (configured && !privilege_running_setid())
		return xstrdup(configured);
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return xstrdup(name);
	self[n] = '\0';
	slash = strrchr(self, '/');
	*slash = '\0';
	return xasprintf("%s/%s", self, name);
}

bool
helper_call(const char *path, const char *const *argv, const struct buf *input, size_t max_answer,
			struct buf *answer, char *err, size_t errlen)
{
	int				 in[2] = {-1, -1};
	int				 out[2] = {-1, -1};
	pid_t			 pid;
	int				 status;
	char			 chunk[4096];
	ssize_t			 n;
	struct sigaction ignore = {.sa_handler = SIG_IGN};
	struct sigaction saved;

	if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		goto err;
	}
	if ((pid = fork()) < 0)
	{
		snprintf(err, errlen, "fork: %s", strerror(errno));
		goto err;
	}
	if (pid == 0)
	{
		size_t count = 0;
		char **copy;

		while (argv[count])
			count++;
		copy = xcalloc(count + 1, sizeof(char *));
		for (size_t i = 0; i < count; i++)
			copy[i] = xstrdup(argv[i]);
		dup2(in[0], STDIN_FILENO);
		dup2(out[1], STDOUT_FILENO);
		/* Set-group-id: the group taken up for this execution of the helper only. */
		if (!privilege_exec_group(true, err, errlen))
		{
			fprintf(stderr, "%s: %s\n", log_progname(), err);
			_exit(127);
		}
		execv(path, copy);
		fprintf(stderr, "%s: cannot run %s: %s\n", log_progname(), path, strerror(errno));
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	in[0] = out[1] = -1;
	/* A command that does not read its input closes the pipe: not our failure. */
	sigaction(SIGPIPE, &ignore, &saved);
	if (input && input->len > 0)
		(void) fd_write_all(in[1], input->data, input->len);
	close(in[1]);
	in[1] = -1;
	sigaction(SIGPIPE, &saved, NULL);
	while ((n = read(out[0], chunk, sizeof(chunk))) != 0)
	{
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			break;
		if (answer->len + (size_t) n <= max_answer)
			buf_append(answer, chunk, (size_t) n);
	}
	close(out[0]);
	out[0] = -1;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
		{
			snprintf(err, errlen, "waitpid: %s", strerror(errno));
			return false;
		}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
	{
		snprintf(err, errlen, "%s %s", path, WIFEXITED(status) ? "failed (see its message above)" : "was killed");
		return false;
	}
	buf_append_char(answer, '\0');
	answer->len--;
	return true;
err:
	for (int i = 0; i < 2; i++)
	{
		if (in[i] >= 0)
			close(in[i]);
		if (out[i] >= 0)
			close(out[i]);
	}
	return false;
}
