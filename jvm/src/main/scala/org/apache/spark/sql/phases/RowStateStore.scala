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
 * with a due timer), committing nothing; the caller computes their new rows; replace() replaces those rows (and
 * their timers' index entries) and commits the next version. A replay loads the same version again, so it looks up
 * and writes the same rows.
 */
package org.apache.spark.sql.phases


import scala.jdk.CollectionConverters._

import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, JoinedRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.{ArrayType, BooleanType, LongType, StructField, StructType}

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

  override protected val keySchema: StructType = StructType(keyColumns.map(schema(_)))
  override protected val valueSchema: StructType = StructType(valueColumns.map(schema(_)))
  override protected val encoding: KeyStateEncoderSpec = NoPrefixKeyStateEncoderSpec(keySchema)
  /** The rows replace() takes and lookup() and read() return. */
  override val rowSchema: StructType = StructType(keySchema.fields ++ valueSchema.fields)
  private val timersAt = valueColumns.indexOf(timersColumn)
  private val timerKeySchema = StructType(StructField("_timer_ms", LongType, nullable = false) +: keySchema.fields)
  private val markerSchema = StructType(Seq(StructField("due", BooleanType)))
  override protected val families: Seq[Family] =
    if (!timed) Nil
    else Seq(Family(RowStateStore.Timers, timerKeySchema, markerSchema, RangeKeyScanStateEncoderSpec(timerKeySchema, Seq(0))))
  override protected def routeColumns: Seq[String] = keyColumns.toIndexedSeq
  override protected def startMayGroup: Boolean = false

  override protected def rowMaker(): (UnsafeRow, UnsafeRow) => InternalRow = {
    val out = StoreSupport.columns(rowSchema.fields.map(_.dataType).toIndexedSeq, 0)
    val joined = new JoinedRow()
    (key, value) => out(joined(key, value))
  }

  /** Writes rows and their timers' index entries through `puts` (made in each task). */
  private final class Rows(state: StateStore, puts: Puts) {
    def this(state: StateStore) = this(state, Puts.direct(state))
    private val keyOf = StoreSupport.columns(keySchema.fields.map(_.dataType).toIndexedSeq, 0)
    private val valueOf = StoreSupport.columns(valueSchema.fields.map(_.dataType).toIndexedSeq, keyColumns.length)
    private val toTimerKey = UnsafeProjection.create(timerKeySchema)
    private val marker = UnsafeProjection.create(markerSchema)(new GenericInternalRow(Array[Any](true))).copy()
    private val one = new GenericInternalRow(1)
    private val joined = new JoinedRow()
    private def timerKey(ms: Long, key: UnsafeRow): UnsafeRow = { one.setLong(0, ms); toTimerKey(joined(one, key)) }
    private def timersOf(value: UnsafeRow): Seq[Long] =
      if (!timed || value.isNullAt(timersAt)) Nil else value.getArray(timersAt).toLongArray().toSeq

    /** Puts `row` (key and value columns); `replacing`: first removes the index entries of the key's stored timers. */
    def put(row: InternalRow, replacing: Boolean): Unit = {
      val key = keyOf(row).copy()
      val value = valueOf(row)
      if (replacing && timed) {
        val before = state.get(key)
        if (before != null) timersOf(before).foreach(ms => state.remove(timerKey(ms, key), RowStateStore.Timers))
      }
      puts.put(key, value, StartLoad.Default)
      timersOf(value).foreach(ms => puts.put(timerKey(ms, key), marker, RowStateStore.Timers))
    }
  }

  override protected def putStart(state: StateStore, puts: Puts, rows: Iterator[InternalRow]): Unit = {
    val writer = new Rows(state, puts)
    rows.foreach(row => writer.put(row, replacing = false))
  }

  /**
   * The stored rows at `version` of the keys in `keys` (key columns; a key without a row is left out) and, when
   * `dueAtOrBelow` (microseconds) is not null, of every key with a timer at or before it; nothing is committed.
   * The returned StoreUpdate's version is `version`.
   */
  def lookup(keys: DataFrame, version: Long, dueAtOrBelow: java.lang.Long): StoreUpdate = {
    require(dueAtOrBelow == null || timed, s"state store $checkpoint has no timers to be due")
    val keyTypes = keySchema.fields.map(_.dataType).toIndexedSeq
    val due = dueAtOrBelow != null
    val boundMs: Long = if (due) Math.floorDiv(dueAtOrBelow.longValue(), 1000L) else Long.MinValue
    val rdd = inStore(routed(keys, keyColumns.toIndexedSeq), version) { (state, input) =>
      val keyOf = StoreSupport.columns(keyTypes, 0)
      val keyOfTimer = StoreSupport.columns(keyTypes, 1)
      val rowOf = rowMaker()
      val found = new java.util.LinkedHashMap[UnsafeRow, InternalRow]()
      def take(key: UnsafeRow): Unit = if (!found.containsKey(key)) {
        val value = state.get(key)
        if (value != null) found.put(key, rowOf(key, value).copy())
      }
      input.foreach(row => take(keyOf(row).copy()))
      if (due) {
        StoreBase.readUpTo(state.iterator(RowStateStore.Timers), 0, boundMs)
          .foreach { case (timerKey, _) => take(keyOfTimer(timerKey).copy()) }
      }
      state.abort()
      found.values().asScala.iterator
    }
    cached(rdd, version)
  }

  /**
   * Replaces the rows of the keys in `rows` (key and value columns, one row per key) in the store at `version` and
   * commits version + 1; each key's timer entries follow its new timers. Returns no rows (count them on the caller's
   * side when needed).
   */
  def replace(rows: DataFrame, version: Long): StoreUpdate = {
    val profile = new StoreProfile(spark.sparkContext)
    val rdd = inStore(routed(rows), version) { (state, input) =>
      val started = System.nanoTime()
      val writer = new Rows(state)
      input.foreach(row => writer.put(row, replacing = true))
      profile.commit(state, started)
      Iterator.empty
    }
    cached(rdd, version + 1, profile)
  }
}

object RowStateStore {
  val Timers = "timers"

  /** From Python: `spark._jsparkSession` (phases.spark_internals.java_session), the rows' schema as JSON,
   * `timersColumn` null for none. */
  def open(
      spark: org.apache.spark.sql.SparkSession,
      checkpoint: String,
      keyColumns: java.util.List[String],
      valueColumns: java.util.List[String],
      timersColumn: String,
      schemaJson: String,
      partitions: Int,
      runId: String): RowStateStore =
    new RowStateStore(spark.asInstanceOf[ClassicSession], checkpoint, keyColumns.asScala.toArray,
      valueColumns.asScala.toArray, timersColumn, StoreSupport.schemaOf(schemaJson), partitions, runId)
}
