"""The sources both phases read, behind one reader (:mod:`~phases.sources.reader`): a Delta table's change feed, a
Kafka topic in arrival chunks, an archive handing over to a topic; where each input's head is and how far behind it
is without Spark (:mod:`~phases.sources.head`, :mod:`~phases.sources.lag`); and helpers to make and feed a source
table (:mod:`~phases.sources.feed`, :mod:`~phases.sources.synthetic`)."""
