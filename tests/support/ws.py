"""What WebSocket tests share."""

# How long a test gives a handshake (channels' WebsocketCommunicator waits 1 s by default). A
# handshake authenticates, checks the Origin, joins its groups and re-checks access: on a test
# machine running four suites on two cores that can take longer than a second, and a refused
# handshake still answers at once, so a generous bound costs nothing.
CONNECT_TIMEOUT_S = 10
