"""Policy: the deterministic job workflow and its playbook. No I/O, clock or randomness."""
