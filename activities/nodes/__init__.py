"""Node agents: how the controller reaches the machines that host ranks.

One interface (:class:`activities.nodes.agent.NodeAgent`), chosen once per
node by :mod:`~activities.nodes.factory`, and one folder per transport: the local
agent (``local/``) runs mechanics on this machine, the ssh one (``ssh/``) sends a
POSIX-sh shim (``shim_agent``, ``shim.sh``) to a remote host with paramiko, the Slurm
one (``slurm/``) runs a job step in the job's allocation, and ``simulated/`` stands in
for nodes in the scale bench. Activities only ever talk to the interface, and to
:mod:`~activities.nodes.allocation` for the allocation itself; what only one
transport does (fencing by step, drains, preemption notices, a launch's checks on
this machine) is a method of the interface that the others answer with their own
default. No code outside this package branches on a launcher's name or an agent's
class (``tests/unit/test_transport_branches.py``): it asks the agent, or the node
spec's capabilities (:mod:`lazarus.domain.transports`).

What runs on or reads a node lives here too, below the activities that use it: the
run directory's layout (``rundir``), ``/proc`` (``procfs``), the rank wrapper and
the zygote with its client, exit notices and the secret environment. So this
package imports nothing from the rest of ``activities``.
"""
