/*
 * The live phase's keyed state in Spark's own state store (RocksDB, changelog checkpointing), used as a library
 * from a foreachBatch micro-batch: point lookups per key instead of a scan of a Delta table.
 *
 * This lives in a package under org.apache.spark.sql because the state store's entry points are Spark-internal
 * (private[sql] session members, the StateStoreOps of the state package). tests/phases/test_keyed_store.py
 * pins every internal class and signature used here and fails naming the one that changed.
 */
package org.apache.spark.sql.phases


import scala.collection.mutable.ArrayBuffer
import scala.jdk.CollectionConverters._

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, JoinedRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType
import org.apache.spark.storage.StorageLevel

/** What one update of the store produced: the changed keys' new rows (cached until released), counts, and the route
 * its rows took to the store's partitions (StoreSupport.withRoutedRows). */
class StoreUpdate(
    private val rows: RDD[InternalRow],
    val frame: DataFrame,
    val changedKeys: Long,
    val committedVersion: Long,
    val route: String = "shuffled",
    profile: StoreProfile = null) {
  /** Where the update's task time went, summed over its tasks ([[StoreProfile]]; empty when not profiled). */
  def profiled: java.util.Map[String, java.lang.Long] =
    if (profile == null) java.util.Collections.emptyMap() else profile.summed

  /** Drops the cached rows (call once the micro-batch's writes are done). */
  def release(): Unit = rows.unpersist(blocking = false)
}

/**
 * One keyed store: `checkpoint`/0/<partition> in Spark's layout, `partitions` partitions hashed the way
 * `repartition(partitions, keys)` hashes, rows = key columns -> value columns. Version v is the state after
 * `v` updates; `update(..., version = v)` loads version v and commits v + 1 (a replayed update loads the same v
 * and writes the same v + 1).
 *
 * `orderColumn` (a long key column, or null): the keys are stored in its order (Spark's range-scan key encoding),
 * so an update can close the rows whose order value is at or below a bound by reading from the start of each
 * partition until the first greater one (windows by their end), not by a scan of the whole store.
 */
class KeyedStateStore(
    session: ClassicSession,
    path: String,
    val keyColumns: Array[String],
    val valueColumns: Array[String],
    val schema: StructType,
    storePartitions: Int,
    runId: String,
    val orderColumn: String) extends StoreBase(session, path, storePartitions, runId) {

  private val missing = (keyColumns ++ valueColumns).filterNot(schema.fieldNames.contains)
  require(missing.isEmpty, s"columns ${missing.mkString(", ")} are not in ${schema.simpleString}")
  /** The ordinal of the order column among the key columns (-1: none). */
  val orderOrdinal: Int = if (orderColumn == null) -1 else keyColumns.indexOf(orderColumn)
  require(orderColumn == null || orderOrdinal >= 0,
    s"the order column $orderColumn is not a key column (${keyColumns.mkString(", ")})")
  require(orderColumn == null || schema(orderColumn).dataType == org.apache.spark.sql.types.LongType,
    s"the order column $orderColumn must be a long, not ${if (orderOrdinal >= 0) schema(orderColumn).dataType.simpleString else "missing"}")

  val keySchema: StructType = StructType(keyColumns.map(schema(_)))
  val valueSchema: StructType = StructType(valueColumns.map(schema(_)))
  /** The rows update() takes and returns: keys, then values. */
  val rowSchema: StructType = StructType(keySchema.fields ++ valueSchema.fields)

  private def encoderSpec: KeyStateEncoderSpec =
    if (orderOrdinal < 0) NoPrefixKeyStateEncoderSpec(keySchema)
    else RangeKeyScanStateEncoderSpec(keySchema, Seq(orderOrdinal))

  /**
   * Combines `partials` (keys + values; several rows of a key combine in turn) into the store at `version` and commits
   * version + 1; returns the changed keys' new rows. `combineSql` per value column: SQL over `t.<column>` (the
   * stored value) and `s.<column>` (the partial); a key not in the store takes the partial as it is.
   * `emit` = false writes without returning rows (the handoff's version 1). The handoff's rows (an update from
   * version 0) reach the store's partitions without a shuffle when they are hash-partitioned by the keys already
   * (StoreSupport.withRoutedRows).
   */
  def update(partials: DataFrame, combineSql: java.util.List[String], version: Long, emit: Boolean): StoreUpdate =
    update(partials, combineSql, version, emit, null)

  /**
   * As above; then, when `closeAtOrBelow` is not null (an ordered store only), every row whose order column is at or
   * below it is removed from the store and returned (after the changed rows, when `emit`): an ordered read from the
   * start of each partition that stops at the first greater row.
   */
  def update(
      partials: DataFrame,
      combineSql: java.util.List[String],
      version: Long,
      emit: Boolean,
      closeAtOrBelow: java.lang.Long): StoreUpdate = {
    require(closeAtOrBelow == null || orderOrdinal >= 0, s"state store $checkpoint has no order column to close by")
    val closeBound: Long = if (closeAtOrBelow == null) Long.MinValue else closeAtOrBelow.longValue()
    val closing = closeAtOrBelow != null
    val orderAt = orderOrdinal
    val (combine, pairAttrs) = StoreSupport.combineExpressions(spark, valueSchema, combineSql.asScala.toSeq)
    val nKeys = keyColumns.length
    val nValues = valueColumns.length
    val keyTypes = keySchema.fields.map(_.dataType)
    val valueTypes = valueSchema.fields.map(_.dataType)
    val rowTypes = rowSchema.fields.map(_.dataType)
    val store = sessionFor(version)
    val profile = new StoreProfile(spark.sparkContext)
    StoreSupport.withRoutedRows(partials, rowSchema.fieldNames.toIndexedSeq, keyColumns.toIndexedSeq, partitions,
      checkpoint, mayGroup = version == 0L) { (routed, route) =>
      val rdd = routed.mapPartitionsWithStateStore(
        stateInfo(version), keySchema, valueSchema, encoderSpec, store.sessionState,
        Some(store.streams.stateStoreCoordinator)) { (state: StateStore, rows: Iterator[InternalRow]) =>
        val keyOf = StoreSupport.columns(keyTypes.toIndexedSeq, 0)
        val valueOf = StoreSupport.columns(valueTypes.toIndexedSeq, nKeys)
        val combined = UnsafeProjection.create(combine, pairAttrs)
        val out = StoreSupport.columns(rowTypes.toIndexedSeq, 0)
        val pair = new GenericInternalRow(2)
        val joined = new JoinedRow()
        // Several rows of one key (records lifted one by one) combine in turn; each key is emitted once, with
        // its value after the whole partition. When emitting, each touched key's newest value is kept here: a
        // key's next row combines with it without reading the store, the key is put once, after the partition,
        // and the emit reads nothing back. Without emitting (version 1's write, one row per key; closing
        // updates), each row is put as it comes, and nothing is held.
        val latest = new java.util.LinkedHashMap[UnsafeRow, UnsafeRow]()
        val started = System.nanoTime()
        rows.foreach { row =>
          val key = keyOf(row)
          val partial = valueOf(row)
          val seen = if (emit) latest.get(key) else null
          // Version 0 is the empty store, written from one row per key (the handoff's state): nothing to read.
          val stored = if (seen != null) seen else if (version == 0L) null else state.get(key)
          val value = if (stored == null) partial else {
            pair.update(0, stored)
            pair.update(1, partial)
            combined(pair)
          }
          if (emit) latest.put(if (seen != null) key else key.copy(), value.copy())
          else state.put(key, value)
        }
        // Each touched key is written once, with its newest value (a drain's 1M rows of 632,000 keys: 632,000 puts).
        val emitted = new ArrayBuffer[InternalRow](latest.size)
        latest.forEach { (key, value) =>
          state.put(key, value)
          emitted += out(joined(key, value)).copy()
        }
        if (closing) {
          // Keys in order: read until the first one past the bound, then remove what was read.
          val closed = new ArrayBuffer[UnsafeRow]()
          val it = state.iterator()
          try {
            var more = true
            while (more && it.hasNext) {
              val pair = it.next()
              if (pair.key.getLong(orderAt) <= closeBound) {
                closed += pair.key.copy()
                emitted += out(joined(pair.key, pair.value)).copy()
              } else more = false
            }
          } finally it.close()
          closed.foreach(key => state.remove(key))
        }
        profile.commit(state, started)
        emitted.iterator
      }
      val cached = rdd.persist(StorageLevel.MEMORY_AND_DISK)
      val changed = try cached.count() catch {
        case e: Throwable =>
          cached.unpersist(blocking = false)
          throw e
      }
      val frame = StoreSupport.frameOf(spark, cached, rowSchema, changed)
      new StoreUpdate(cached, frame, changed, version + 1, route, profile)
    }
  }

  /** Every row of the store at `version` (nothing is committed). */
  def read(version: Long): DataFrame = {
    val keyTypes = keySchema.fields.map(_.dataType)
    val nothing = spark.sparkContext.parallelize(Seq.empty[InternalRow], partitions)
    val store = sessionFor(version)
    val rdd = nothing.mapPartitionsWithStateStore(
      stateInfo(version), keySchema, valueSchema, encoderSpec, store.sessionState,
      Some(store.streams.stateStoreCoordinator)) { (state: StateStore, _: Iterator[InternalRow]) =>
      val joined = new JoinedRow()
      val out = UnsafeProjection.create(rowSchema)
      val rows: Array[InternalRow] = state.iterator().map(p => out(joined(p.key, p.value)).copy(): InternalRow).toArray
      state.abort()
      rows.iterator
    }
    spark.internalCreateDataFrame(rdd, rowSchema)
  }
}

object KeyedStateStore {

  /** From Python: `spark._jsparkSession`, the DataFrame's schema as JSON. */
  def open(
      spark: org.apache.spark.sql.SparkSession,
      checkpoint: String,
      keyColumns: java.util.List[String],
      valueColumns: java.util.List[String],
      schemaJson: String,
      partitions: Int,
      runId: String): KeyedStateStore = open(spark, checkpoint, keyColumns, valueColumns, schemaJson, partitions, runId, null)

  /** As above, the keys in the order of the long key column `orderColumn` (null: no order). */
  def open(
      spark: org.apache.spark.sql.SparkSession,
      checkpoint: String,
      keyColumns: java.util.List[String],
      valueColumns: java.util.List[String],
      schemaJson: String,
      partitions: Int,
      runId: String,
      orderColumn: String): KeyedStateStore = {
    val schema = org.apache.spark.sql.types.DataType.fromJson(schemaJson).asInstanceOf[StructType]
    new KeyedStateStore(spark.asInstanceOf[ClassicSession], checkpoint, keyColumns.asScala.toArray,
      valueColumns.asScala.toArray, schema, partitions, runId, orderColumn)
  }
}
