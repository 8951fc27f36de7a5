"""Node agents: how the controller reaches the machines that host ranks.

One interface (:class:`activities.nodes.agent.NodeAgent`), chosen once per
node by :mod:`~activities.nodes.factory`: the local agent runs mechanics on
this machine, the ssh one sends a POSIX-sh shim to a remote host with paramiko, the
Slurm one runs a job step in the job's allocation. Activities only ever talk to the
interface, and to :mod:`~activities.nodes.allocation` for the allocation
itself; what only one scheduler can do (drain, preemption notices) is a capability
of the interface that the others answer with None.

What runs on or reads a node lives here too, below the activities that use it: the
run directory's layout (``rundir``), ``/proc`` (``procfs``), the rank wrapper and
the zygote with its client, exit notices and the secret environment. So this
package imports nothing from the rest of ``activities``.
"""
