"""``make soak``: many jobs of every kind under combined faults, their books checked at the end (issue 34).

A generator (:mod:`scripts.soak.driver`, jobs from :mod:`scripts.soak.kinds` over data from
:mod:`scripts.soak.data`) keeps jobs running on a real stack (:mod:`scripts.soak.cluster`); a nemesis
(:mod:`scripts.soak.nemesis`) injects faults on a schedule drawn from the seed; a checker
(:mod:`scripts.soak.checker`, :mod:`scripts.soak.bounds`, reading :mod:`scripts.soak.outputs`) proves every job's
books from first principles at the end. The run itself is :mod:`scripts.soak.run` (``python -m scripts.soak``).
The workers load :mod:`scripts.soak.handlers`: keep this package's ``__init__`` free of imports.
"""
