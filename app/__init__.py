"""rankwatch: live straggler, hang and faulty-machine analysis for training jobs.

The top-level folders of the repository are mapped into this namespace
(``hooks/`` -> ``rankwatch.hooks`` ...). This package itself is the composition
root: the CLI and configuration that wire the parts together.
"""

__version__ = "0.1.0"
