"""Pictures of plans (matplotlib, PNG or SVG by the file's suffix).

Each view is a module with a ``draw_*`` function that writes one file and
returns what it drew (so that tests and reports can check the picture's
content), and :mod:`alpa_ir.plots.views` picks the views that apply to a
planned module (``executable.plot(kind, path)``, ``alpa-opt --view=DIR``).
Every drawn element carries a ``gid`` (an ``id`` in SVG): ``run-S-PHASE-M``,
``transfer-SRC-DST-M``, ``device-D``, ``peak-S``, ``tile-T-ROW-COLUMN``,
``predicted-PROGRAM-KIND``, ``line-METHOD``.
"""
