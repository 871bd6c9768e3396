/*
 * curl_client.c
 *		What libcurl alone can do: POSTs one request body to a URL as fast as
 *		a libcurl multi handle allows with a given number of requests in
 *		flight, the way the relay's webhook sink uses libcurl (a new easy
 *		handle and header list per request, connections kept alive by the
 *		multi handle), with no database work at all. bench/relay.sh runs it
 *		beside wrk, so that the relay's single-mode rate can be read against
 *		the HTTP client it is built on as well as against the receiver.
 *
 *	curl_client <url> <requests> <in flight> <body file> <headers file> [sockets]
 *
 * The headers file has one "Name: value" line per header. Prints the
 * requests per second; exits 1 if any request failed or was not answered
 * with 2xx.
 *
 * By default the multi handle is driven as a client that does nothing else
 * drives it: curl_multi_perform, then curl_multi_poll. With "sockets" it is
 * driven as the relay's worker drives it, as any program that waits on
 * other things as well must: curl tells which sockets to wait on
 * (CURLMOPT_SOCKETFUNCTION) and when (CURLMOPT_TIMERFUNCTION), the sockets
 * wait in an epoll set, and each ready one is handed to
 * curl_multi_socket_action.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <sys/epoll.h>

static size_t
discard(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	(void) ptr;
	(void) userdata;
	return size * nmemb;
}

/* The whole of a file, NUL-terminated; exits on failure. */
static char *
read_file(const char *path, long *len)
{
	FILE	   *f = fopen(path, "rb");
	char	   *buf;

	if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (*len = ftell(f)) < 0)
	{
		perror(path);
		exit(2);
	}
	rewind(f);
	buf = malloc(*len + 1);
	if (buf == NULL || fread(buf, 1, *len, f) != (size_t) *len)
	{
		perror(path);
		exit(2);
	}
	buf[*len] = '\0';
	fclose(f);
	return buf;
}

/* Starts one request: a new easy handle and header list, as the relay does. */
static void
start_request(CURLM *multi, const char *url, const char *body, long body_len,
			  char *header_lines)
{
	CURL	   *easy = curl_easy_init();
	struct curl_slist *headers = curl_slist_append(NULL, "Expect:");
	char	   *copy = strdup(header_lines);
	char	   *save = NULL;
	char	   *line;

	for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		headers = curl_slist_append(headers, line);
	free(copy);
	curl_easy_setopt(easy, CURLOPT_URL, url);
	curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) body_len);
	curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, discard);
	curl_easy_setopt(easy, CURLOPT_PRIVATE, headers);
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(easy, CURLOPT_PROXY, "");
	curl_multi_add_handle(multi, easy);
}

/* "sockets": the epoll set of curl's sockets, and curl's next timeout (-1: none). */
static int	epoll_fd = -1;
static long curl_timeout_ms = -1;

/* CURLMOPT_SOCKETFUNCTION: what to wait for on a socket; socketp marks one in the set. */
static int
socket_changed(CURL *easy, curl_socket_t s, int what, void *multi, void *socketp)
{
	struct epoll_event ev;

	(void) easy;
	memset(&ev, 0, sizeof(ev));
	if (what == CURL_POLL_REMOVE)
	{
		epoll_ctl(epoll_fd, EPOLL_CTL_DEL, s, &ev);
		curl_multi_assign(multi, s, NULL);
		return 0;
	}
	ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0);
	ev.data.fd = s;
	if (socketp == NULL)
	{
		epoll_ctl(epoll_fd, EPOLL_CTL_ADD, s, &ev);
		curl_multi_assign(multi, s, &epoll_fd);
	}
	else
		epoll_ctl(epoll_fd, EPOLL_CTL_MOD, s, &ev);
	return 0;
}

/* CURLMOPT_TIMERFUNCTION */
static int
timer_changed(CURLM *multi, long timeout_ms, void *arg)
{
	(void) multi;
	(void) arg;
	curl_timeout_ms = timeout_ms;
	return 0;
}

/* One wait and the work it brings, "sockets" mode. */
static void
drive_by_sockets(CURLM *multi)
{
	struct epoll_event ready[64];
	int			n;
	int			still;

	n = epoll_wait(epoll_fd, ready, 64, curl_timeout_ms < 0 ? 100 : (int) curl_timeout_ms);
	if (n <= 0)
	{
		curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &still);
		return;
	}
	for (int i = 0; i < n; i++)
	{
		int			mask = 0;

		if (ready[i].events & EPOLLIN)
			mask |= CURL_CSELECT_IN;
		if (ready[i].events & EPOLLOUT)
			mask |= CURL_CSELECT_OUT;
		if (ready[i].events & (EPOLLERR | EPOLLHUP))
			mask |= CURL_CSELECT_ERR;
		curl_multi_socket_action(multi, ready[i].data.fd, mask, &still);
	}
}

int
main(int argc, char **argv)
{
	CURLM	   *multi;
	long		body_len;
	long		headers_len;
	char	   *body;
	char	   *header_lines;
	int			total;
	int			in_flight;
	int			started = 0;
	int			finished = 0;
	int			failed = 0;
	int			running = 0;
	struct timespec t0;
	struct timespec t1;
	double		secs;
	int			by_sockets;

	if (argc != 6 && !(argc == 7 && strcmp(argv[6], "sockets") == 0))
	{
		fprintf(stderr, "usage: %s <url> <requests> <in flight> <body file> <headers file> [sockets]\n", argv[0]);
		return 2;
	}
	by_sockets = (argc == 7);
	total = atoi(argv[2]);
	in_flight = atoi(argv[3]);
	body = read_file(argv[4], &body_len);
	header_lines = read_file(argv[5], &headers_len);

	curl_global_init(CURL_GLOBAL_ALL);
	multi = curl_multi_init();
	if (by_sockets)
	{
		epoll_fd = epoll_create1(0);
		curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, socket_changed);
		curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, multi);
		curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, timer_changed);
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (finished < total)
	{
		CURLMsg    *msg;
		int			queued;
		int			still;

		while (running < in_flight && started < total)
		{
			start_request(multi, argv[1], body, body_len, header_lines);
			started++;
			running++;
		}
		if (by_sockets)
		{
			/* a new request starts at curl's timeout 0, which this call handles */
			if (curl_timeout_ms == 0)
				curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &still);
		}
		else
			curl_multi_perform(multi, &still);
		while ((msg = curl_multi_info_read(multi, &queued)) != NULL)
		{
			struct curl_slist *headers;
			long		status = 0;

			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
			if (msg->data.result != CURLE_OK || status < 200 || status > 299)
				failed++;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &headers);
			curl_multi_remove_handle(multi, msg->easy_handle);
			curl_easy_cleanup(msg->easy_handle);
			curl_slist_free_all(headers);
			running--;
			finished++;
		}
		/* Freed slots are filled before waiting, as the relay does. */
		if (running < in_flight && started < total)
			continue;
		if (running > 0 && by_sockets)
			drive_by_sockets(multi);
		else if (running > 0)
			curl_multi_poll(multi, NULL, 0, 100, NULL);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("%d requests in %.3f s: %.0f requests/s, %d failed\n", total, secs, total / secs, failed);
	curl_multi_cleanup(multi);
	return failed > 0 ? 1 : 0;
}
