"""What the engine runs on: the SparkSession (:mod:`~phases.runtime.session`), the JVM jars
(:mod:`~phases.runtime.jvm_deps`), code shipped to a cluster (:mod:`~phases.runtime.shipping`), the user's code by
import path (:mod:`~phases.runtime.user_code`), and the local broker and cluster of the demo and the tests."""
