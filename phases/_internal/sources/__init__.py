"""The sources both phases read, behind one reader (:mod:`~phases._internal.sources.reader`): a Delta table's change
feed, a Kafka topic in arrival chunks, an archive handing over to a topic; where each input's head is and how far behind
it is without Spark (:mod:`~phases._internal.sources.head`, :mod:`~phases._internal.sources.lag`); and helpers to make
and feed a source table (:mod:`~phases._internal.sources.feed`, :mod:`~phases._internal.sources.synthetic`)."""
