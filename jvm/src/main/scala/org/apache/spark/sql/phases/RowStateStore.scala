/*
 * Whole state rows by key in Spark's state store (RocksDB, changelog checkpointing), for operators whose new state
 * is computed outside the store (a process function's Python pass, an interval join's held rows):
 *
 * - the default family: key -> the key's state row;
 * - with a timers column (process functions): "timers": (timer, key) -> a marker, stored in the order of the timer
 *   (epoch milliseconds; Spark's range-scan key encoding): the keys whose timers a watermark makes due are read from
 *   the start of each partition until the first later timer, not by a scan of every key's state.
 *
 * A micro-batch makes two passes over the store: lookup() returns the rows of the batch's keys (and of the keys
 * with a due timer), committing nothing; the caller computes their new rows; update() replaces those rows (and
 * their timers' index entries) and commits the next version. A replay loads the same version again, so it looks up
 * and writes the same rows.
 */
package org.apache.spark.sql.phases


import scala.collection.mutable.ArrayBuffer
import scala.jdk.CollectionConverters._

import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, JoinedRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.{ArrayType, BooleanType, LongType, StructField, StructType}
import org.apache.spark.storage.StorageLevel

/**
 * The store at `checkpoint` (Spark's layout), `partitions` partitions by the hash of the key columns. Rows: key
 * columns, then value columns; `timersColumn` (a value column, array of long: epoch milliseconds; or null) is
 * indexed.
 */
class RowStateStore(
    session: ClassicSession,
    path: String,
    val keyColumns: Array[String],
    val valueColumns: Array[String],
    val timersColumn: String,
    val schema: StructType,
    storePartitions: Int,
    runId: String) extends StoreBase(session, path, storePartitions, runId) {

  private val missing = (keyColumns ++ valueColumns).filterNot(schema.fieldNames.contains)
  require(missing.isEmpty, s"columns ${missing.mkString(", ")} are not in ${schema.simpleString}")
  private val timed = timersColumn != null
  require(!timed || valueColumns.contains(timersColumn), s"the timers column $timersColumn is not a value column")
  require(!timed || (schema(timersColumn).dataType.isInstanceOf[ArrayType] &&
    schema(timersColumn).dataType.asInstanceOf[ArrayType].elementType == LongType),
    s"the timers column $timersColumn must be an array of long, not ${schema(timersColumn).dataType.simpleString}")

  val keySchema: StructType = StructType(keyColumns.map(schema(_)))
  val valueSchema: StructType = StructType(valueColumns.map(schema(_)))
  /** The rows update() takes and lookup() and read() return. */
  val rowSchema: StructType = StructType(keySchema.fields ++ valueSchema.fields)
  private val timersAt = valueColumns.indexOf(timersColumn)
  private val timerKeySchema = StructType(StructField("_timer_ms", LongType, nullable = false) +: keySchema.fields)
  private val markerSchema = StructType(Seq(StructField("due", BooleanType)))

  /** Runs `f` in each store partition over `rows`' `columns` (routed by the key columns) at `version`. */
  private def inStore(rows: DataFrame, columns: Seq[String], version: Long)(
      f: (StateStore, Iterator[InternalRow]) => Iterator[InternalRow]) = {
    val session = sessionFor(version)
    val routed = StoreSupport.routed(rows, columns, keyColumns.toIndexedSeq, partitions, checkpoint)
    val timers = RowStateStore.Timers
    val (timerKeys, markers, withTimers) = (timerKeySchema, markerSchema, timed)
    routed.mapPartitionsWithStateStore(
      stateInfo(version), keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema), session.sessionState,
      Some(session.streams.stateStoreCoordinator), useColumnFamilies = withTimers) {
      (state: StateStore, it: Iterator[InternalRow]) =>
        if (withTimers) {
          state.createColFamilyIfAbsent(timers, timerKeys, markers, RangeKeyScanStateEncoderSpec(timerKeys, Seq(0)))
        }
        f(state, it)
    }
  }

  private def cached(rdd: org.apache.spark.rdd.RDD[InternalRow], version: Long): StoreUpdate = {
    val rows = rdd.persist(StorageLevel.MEMORY_AND_DISK)
    val n = rows.count()
    new StoreUpdate(rows, StoreSupport.frameOf(spark, rows, rowSchema, n), n, version)
  }

  /**
   * The stored rows at `version` of the keys in `keys` (key columns; a key without a row is left out) and, when
   * `dueAtOrBelow` (microseconds) is not null, of every key with a timer at or before it; nothing is committed.
   * The returned StoreUpdate's version is `version`.
   */
  def lookup(keys: DataFrame, version: Long, dueAtOrBelow: java.lang.Long): StoreUpdate = {
    val keyTypes = keySchema.fields.map(_.dataType).toIndexedSeq
    val rowTypes = rowSchema.fields.map(_.dataType).toIndexedSeq
    require(dueAtOrBelow == null || timed, s"state store $checkpoint has no timers to be due")
    val due = dueAtOrBelow != null
    val boundMs: Long = if (due) Math.floorDiv(dueAtOrBelow.longValue(), 1000L) else Long.MinValue
    val timers = RowStateStore.Timers
    val rdd = inStore(keys, keyColumns.toIndexedSeq, version) { (state, input) =>
      val keyOf = StoreSupport.columns(keyTypes, 0)
      val keyOfTimer = StoreSupport.columns(keyTypes, 1)
      val out = StoreSupport.columns(rowTypes, 0)
      val joined = new JoinedRow()
      val found = new java.util.LinkedHashMap[UnsafeRow, InternalRow]()
      def take(key: UnsafeRow): Unit = if (!found.containsKey(key)) {
        val value = state.get(key)
        if (value != null) found.put(key, out(joined(key, value)).copy())
      }
      input.foreach(row => take(keyOf(row).copy()))
      if (due) {
        val dueKeys = ArrayBuffer[UnsafeRow]()
        val it = state.iterator(timers)
        try {
          var more = true
          while (more && it.hasNext) {
            val p = it.next()
            if (p.key.getLong(0) <= boundMs) dueKeys += keyOfTimer(p.key).copy() else more = false
          }
        } finally it.close()
        dueKeys.foreach(take)
      }
      state.abort()
      found.values().asScala.iterator
    }
    cached(rdd, version)
  }

  /**
   * Replaces the rows of the keys in `rows` (key and value columns, one row per key) in the store at `version` and
   * commits version + 1; each key's timer entries follow its new timers. (`combineSql`, `emit` and `closeAtOrBelow`
   * are not used: the same signature as the other stores', for the handoff's version 1.)
   */
  def update(
      rows: DataFrame,
      combineSql: java.util.List[String],
      version: Long,
      emit: Boolean,
      closeAtOrBelow: java.lang.Long): StoreUpdate = {
    require(!emit && closeAtOrBelow == null, "a timer store replaces rows; it neither emits nor closes")
    val nK = keyColumns.length
    val keyTypes = keySchema.fields.map(_.dataType).toIndexedSeq
    val valueTypes = valueSchema.fields.map(_.dataType).toIndexedSeq
    val timers = RowStateStore.Timers
    val (timerKeys, markers, at, withTimers) = (timerKeySchema, markerSchema, timersAt, timed)
    val profile = new StoreProfile(spark.sparkContext)
    val rdd = inStore(rows, rowSchema.fieldNames.toIndexedSeq, version) { (state, input) =>
      val started = System.nanoTime()
      val keyOf = StoreSupport.columns(keyTypes, 0)
      val valueOf = StoreSupport.columns(valueTypes, nK)
      val toTimerKey = UnsafeProjection.create(timerKeys)
      val marker = UnsafeProjection.create(markers)(new GenericInternalRow(Array[Any](true))).copy()
      val one = new GenericInternalRow(1)
      val joined = new JoinedRow()
      def timerKey(ms: Long, key: UnsafeRow): UnsafeRow = { one.setLong(0, ms); toTimerKey(joined(one, key)) }
      def timersOf(value: UnsafeRow): Seq[Long] =
        if (!withTimers || value.isNullAt(at)) Nil else value.getArray(at).toLongArray().toSeq
      input.foreach { row =>
        val key = keyOf(row).copy()
        val value = valueOf(row)
        if (version > 0L && withTimers) {
          val before = state.get(key)
          if (before != null) timersOf(before).foreach(ms => state.remove(timerKey(ms, key), timers))
        }
        state.put(key, value)
        timersOf(value).foreach(ms => state.put(timerKey(ms, key), marker, timers))
      }
      profile.commit(state, started)
      Iterator.empty
    }
    rdd.count()
    // The rows replaced are not returned: count them on the caller's side when needed.
    new StoreUpdate(rdd, spark.internalCreateDataFrame(spark.sparkContext.emptyRDD[InternalRow], rowSchema), 0L,
      version + 1, profile = profile)
  }

  /** Every row of the store at `version` (nothing is committed). */
  def read(version: Long): DataFrame = {
    val rowTypes = rowSchema.fields.map(_.dataType).toIndexedSeq
    val nothing = spark.createDataFrame(spark.sparkContext.emptyRDD[Row], keySchema)
    val rdd = inStore(nothing, keyColumns.toIndexedSeq, version) { (state, _) =>
      val out = StoreSupport.columns(rowTypes, 0)
      val joined = new JoinedRow()
      val it = state.iterator()
      val rows = try it.map(p => out(joined(p.key, p.value)).copy(): InternalRow).toArray finally it.close()
      state.abort()
      rows.iterator
    }
    spark.internalCreateDataFrame(rdd, rowSchema)
  }
}

object RowStateStore {
  val Timers = "timers"

  /** From Python: `spark._jsparkSession`, the rows' schema as JSON, `timersColumn` null for none. */
  def open(
      spark: org.apache.spark.sql.SparkSession,
      checkpoint: String,
      keyColumns: java.util.List[String],
      valueColumns: java.util.List[String],
      timersColumn: String,
      schemaJson: String,
      partitions: Int,
      runId: String): RowStateStore = {
    val schema = org.apache.spark.sql.types.DataType.fromJson(schemaJson).asInstanceOf[StructType]
    new RowStateStore(spark.asInstanceOf[ClassicSession], checkpoint, keyColumns.asScala.toArray,
      valueColumns.asScala.toArray, timersColumn, schema, partitions, runId)
  }
}
