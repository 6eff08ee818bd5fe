"""Tools the tests, the benchmarks and the demo share; not part of the package (not in
the wheel): throwaway ``redis-server`` processes (``redis_servers``), processes started
and stopped together such as ``celery worker`` (``processes``), and the measures the
figures are made of (``measures``)."""
