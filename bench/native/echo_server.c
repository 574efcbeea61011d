/* The interpreter-free floor of a server round trip, for bench/ring_trial.py.
 *
 * Serves one connection on a Unix socket: reads a message of at most 64 KiB and
 * writes the same bytes back, until the peer closes. bench/ring_trial.py runs the same
 * loop in Python (its echo_server) and times both from the same Python client, so the
 * difference is what the interpreter costs a server per round trip.
 *
 * Usage: echo_server SOCKET_PATH (prints READY once listening).
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct sockaddr_un address = { .sun_family = AF_UNIX };
	static char buffer[65536];
	int listener, conn;
	ssize_t got;

	if (argc != 2 || strlen(argv[1]) >= sizeof(address.sun_path)) {
		fprintf(stderr, "usage: echo_server SOCKET_PATH\n");
		return 2;
	}
	strcpy(address.sun_path, argv[1]);
	listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (listener < 0 || bind(listener, (struct sockaddr *)&address, sizeof(address)) < 0 ||
	    listen(listener, 1) < 0) {
		perror("echo_server");
		return 1;
	}
	printf("READY\n");
	fflush(stdout);
	conn = accept(listener, NULL, NULL);
	if (conn < 0) {
		perror("accept");
		return 1;
	}
	while ((got = recv(conn, buffer, sizeof(buffer), 0)) > 0) {
		if (send(conn, buffer, (size_t)got, 0) != got) {
			perror("send");
			return 1;
		}
	}
	close(conn);
	close(listener);
	return got < 0;
}
