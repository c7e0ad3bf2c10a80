"""The SQL of every panel, one module per board, as named constants.

Queries are written for the ClickHouse datasource plugin: ``$__timeFilter(time)`` and
``$__timeInterval(time)`` are its macros, ``${job}`` and friends are dashboard variables
(single values go in unquoted, so the SQL quotes them), and a time-series query returns
a ``time`` column first. Tables written with a version column are read with ``FINAL`` so
a re-analysed step counts once.
"""
