"""Simulated nodes: no processes, no network, for the scale bench and its tests
(``agent``); not a launcher a job spec can name."""
