"""ssh nodes: the POSIX-sh shim (:mod:`activities.nodes.shim_agent`) sent to a remote host
with paramiko (``agent``), the routes and jump hosts of ``~/.ssh/config`` (``config``)
and the files the agent keeps on the node (``files``)."""
