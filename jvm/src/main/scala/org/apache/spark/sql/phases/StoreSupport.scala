/*
 * What the engine's state stores share: the session their SQL conf comes from, rows routed to store partitions the
 * way repartition(n, keys) routes them, and the combine expressions analysed once on the driver.
 */
package org.apache.spark.sql.phases

import java.util.UUID

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Attribute, BoundReference, Expression, UnsafeProjection}
import org.apache.spark.sql.catalyst.plans.logical.Project
import org.apache.spark.sql.classic.{Dataset => ClassicDataset, SparkSession => ClassicSession}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.functions.col
import org.apache.spark.sql.types.{DataType, StructField, StructType}

object StoreSupport {
  val RocksDBProvider = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

  /** A session whose SQL conf the store reads: RocksDB with changelog checkpointing (a commit writes the changed
   * keys only; snapshots are uploaded by Spark's maintenance thread). `writeOnce`: version 1's write, whose provider
   * is unloaded after its commit instead of holding the whole store in memory. */
  def storeSession(spark: ClassicSession, writeOnce: Boolean): ClassicSession = {
    val s = spark.cloneSession()
    s.conf.set("spark.sql.streaming.stateStore.providerClass", RocksDBProvider)
    s.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    // Counting the store's rows costs RocksDB a read before every write; nothing here needs the count.
    s.conf.set("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
    if (writeOnce) s.conf.set("spark.sql.streaming.stateStore.unloadOnCommit", "true")
    s
  }

  /** `rows`' `columns`, in `partitions` partitions by the hash of the `by` columns (repartition's). */
  def routed(rows: DataFrame, columns: Seq[String], by: Seq[String], partitions: Int, store: String): RDD[InternalRow] = {
    val ds = rows.select(columns.map(n => col(s"`$n`")): _*).repartition(partitions, by.map(n => col(s"`$n`")): _*)
    val rdd = ds.asInstanceOf[ClassicDataset[Row]].queryExecution.toRdd
    if (rdd.getNumPartitions != partitions) {
      throw new IllegalStateException(
        s"the rows for state store $store came in ${rdd.getNumPartitions} partitions, not $partitions")
    }
    rdd
  }

  /** The combine expressions (SQL over structs `t`, the stored values, and `s`, the new ones), analysed once; each
   * must have its value column's type. */
  def combineExpressions(
      spark: ClassicSession,
      valueSchema: StructType,
      combineSql: Seq[String]): (Seq[Expression], Seq[Attribute]) = {
    require(combineSql.length == valueSchema.length,
      s"${combineSql.length} combine expressions for ${valueSchema.length} value columns")
    val pair = StructType(Seq(StructField("t", valueSchema), StructField("s", valueSchema)))
    val empty = spark.createDataFrame(spark.sparkContext.emptyRDD[Row], pair)
    val analyzed = empty.selectExpr(combineSql: _*).queryExecution.analyzed
    analyzed match {
      case Project(list, child) =>
        list.zip(valueSchema.fields).foreach { case (e, f) =>
          if (e.dataType != f.dataType) {
            throw new IllegalArgumentException(
              s"the combine expression of ${f.name} is ${e.dataType.simpleString}, the state column is " +
                f.dataType.simpleString)
          }
        }
        (list, child.output)
      case other => throw new IllegalStateException(s"unexpected plan for the combine expressions: $other")
    }
  }

  /** A projection of the columns of `types`, read from ordinal `from` on. */
  def columns(types: Seq[DataType], from: Int): UnsafeProjection =
    UnsafeProjection.create(types.zipWithIndex.map { case (t, i) =>
      BoundReference(from + i, t, nullable = true): Expression })
}

/**
 * What every store of the engine is: Spark's layout under `checkpoint` (operator 0), `partitions` partitions, the
 * run id its providers are kept loaded under, and the sessions whose SQL conf its tasks read.
 */
abstract class StoreBase(
    @transient protected val spark: ClassicSession,
    val checkpoint: String,
    val partitions: Int,
    runId: String) extends Serializable {

  require(partitions > 0, s"partitions must be positive, got $partitions")
  private val queryRunId = UUID.fromString(runId)
  @transient private lazy val storeSession: ClassicSession = StoreSupport.storeSession(spark, writeOnce = false)
  @transient private lazy val writeOnceSession: ClassicSession = StoreSupport.storeSession(spark, writeOnce = true)

  /** The session of an update from `version`: version 0 (the handoff's version 1) is written under a provider of its
   * own, unloaded after its commit, instead of holding the whole store in the executor's memory. */
  protected def sessionFor(version: Long): ClassicSession = if (version == 0L) writeOnceSession else storeSession

  protected def stateInfo(version: Long): StatefulOperatorStateInfo = {
    // Executors keep a provider per (store, run id) with the settings it was created with: version 1's write
    // (unloaded on commit) must not share one with the live updates.
    val runId = if (version == 0L) UUID.randomUUID() else queryRunId
    StatefulOperatorStateInfo(checkpoint, runId, 0L, version, partitions, None, None)
  }
}
