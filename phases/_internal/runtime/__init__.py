"""What the engine runs on: the SparkSession (:mod:`~phases._internal.runtime.session`), the JVM jars
(:mod:`~phases._internal.runtime.jvm_deps`), code shipped to a cluster (:mod:`~phases._internal.runtime.shipping`), the
user's code by import path (:mod:`~phases._internal.runtime.user_code`), and the local broker and cluster of the demo
and the tests."""
