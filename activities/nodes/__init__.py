"""Node agents: how the controller reaches the machines that host ranks.

One interface (:class:`lazarus.activities.nodes.agent.NodeAgent`), two transports: the
local one runs mechanics on this machine, the ssh one sends a POSIX-sh shim to a
remote host with paramiko. Activities only ever talk to the interface.
"""
