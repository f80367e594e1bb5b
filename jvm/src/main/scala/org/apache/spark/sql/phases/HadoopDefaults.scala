package org.apache.spark.sql.phases

import scala.jdk.CollectionConverters._

import org.apache.hadoop.conf.Configuration

/**
 * YARN's defaults taken out of a session's Hadoop configuration.
 *
 * Spark's context loads Hadoop's MapReduce classes, which register `yarn-default.xml` as a default resource of every
 * `Configuration`: 527 of the 1,104 properties of a local session's configuration (Spark 4.2.0, Hadoop 3.5.0), read only
 * by YARN's own clients. Spark serializes the whole configuration into every file scan's broadcast, every write task
 * and every state store RDD: for the engine's many small jobs that was a measurable part of their driver time.
 * A session that does not run on YARN drops them; the other properties keep their values (checked after the drop, and
 * restored should a deprecation alias have taken one with it). Only the YARN client reads the dropped keys, and a
 * key a user sets (`spark.hadoop.yarn.*`) comes from Spark, not from `yarn-default.xml`, so it stays.
 * phases/_internal/runtime/session.py calls it; tests/phases/runtime/test_spark_internals.py pins it.
 */
object HadoopDefaults {

  val YarnDefaults = "yarn-default.xml"

  /** Drops from `conf` the properties whose value came from YARN's defaults file; returns how many it dropped. */
  def dropYarnDefaults(conf: Configuration): Int = {
    val entries = conf.iterator().asScala.map(e => e.getKey -> e.getValue).toList
    val (dropped, kept) = entries.partition { case (key, _) => fromYarnDefaults(conf, key) }
    dropped.foreach { case (key, _) => conf.unset(key) }
    kept.foreach { case (key, value) => if (conf.getRaw(key) != value) conf.set(key, value) }
    dropped.size
  }

  private def fromYarnDefaults(conf: Configuration, key: String): Boolean = {
    val sources = conf.getPropertySources(key)
    key.startsWith("yarn.") && sources != null && sources.nonEmpty && sources(0) == YarnDefaults
  }
}
