"""The version of Lazarus: the controller (``lazarus-train``) and its rank helper
(``lazarus-rank``, ``rank/pyproject.toml``) are released together, under one number.

``lazarus`` and ``lazarus.domain`` are namespace packages (PEP 420: no
``__init__.py``): ``lazarus-train`` ships all of ``lazarus``, and ``lazarus-rank``
ships :mod:`lazarus.rank` and the standard-library modules of the domain it speaks
(``environment``, ``checkpoint_layout``, ``chaos_points``, ``phases``,
``memory_tier``), which a training image installs instead. So the version lives
here, in a module both ship, and ``tests/unit/test_rank_distribution.py`` checks that
both ``pyproject.toml`` files say the same.
"""

from __future__ import annotations

__version__ = "0.1.0"
