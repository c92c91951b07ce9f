"""MCP support: the product's client (`client`), owner operations on servers and their
tools (`sync`), the Tool that runs a remote tool (`tool`), and a shipped example server."""
