/*
 * Session windows' live state in Spark's state store (RocksDB, changelog checkpointing, two column families):
 *
 * - the default family: (group keys, session start) -> (session end, values), read by a prefix scan on the group
 *   keys: a key's open sessions, found by point lookups, not a scan of every session;
 * - "by_end": (session end, group keys, session start) -> a marker, stored in the order of the end (Spark's
 *   range-scan key encoding): the sessions the watermark closed are read from the start of each partition until
 *   the first one that ends later.
 *
 * An update merges each touched key's open sessions with the batch's records by Spark's session rule (sorted by
 * start, a session takes the next one in when that one starts at or before its end; values combine with the same
 * SQL the backlog's merge uses), then closes. A replay loads the same version again, so it writes the same next one.
 * Times are microseconds.
 */
package org.apache.spark.sql.phases


import scala.collection.mutable.ArrayBuffer
import scala.jdk.CollectionConverters._

import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, JoinedRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.{BooleanType, LongType, StructField, StructType}

/** A session of a key while its sessions merge: `stored` = loaded from the store (else a batch's record). */
private final case class OpenSession(start: Long, end: Long, values: UnsafeRow, stored: Boolean)

/** A session the merge makes of `members`; `touched` once it holds a batch's record. */
private final class MergedSession(first: OpenSession) {
  val start: Long = first.start
  var end: Long = first.end
  var values: UnsafeRow = first.values
  var touched: Boolean = !first.stored
  val members: ArrayBuffer[OpenSession] = ArrayBuffer(first)
}

/**
 * The store at `checkpoint` (Spark's layout), `partitions` partitions by the hash of the group columns. Rows that
 * an update takes and returns: group columns, `startColumn`, `endColumn`, value columns (`schema` has them all).
 */
class SessionStateStore(
    session: ClassicSession,
    path: String,
    val groupColumns: Array[String],
    val startColumn: String,
    val endColumn: String,
    val valueColumns: Array[String],
    val schema: StructType,
    storePartitions: Int,
    runId: String) extends StoreBase(session, path, storePartitions, runId) {

  private val missing = (groupColumns ++ Seq(startColumn, endColumn) ++ valueColumns).filterNot(schema.fieldNames.contains)
  require(missing.isEmpty, s"columns ${missing.mkString(", ")} are not in ${schema.simpleString}")
  Seq(startColumn, endColumn).foreach { c =>
    require(schema(c).dataType == LongType, s"the session column $c must be a long, not ${schema(c).dataType.simpleString}")
  }

  val groupSchema: StructType = StructType(groupColumns.map(schema(_)))
  private val sessionValues: StructType = StructType(valueColumns.map(schema(_)))
  /** The rows an update takes and returns. */
  override val rowSchema: StructType =
    StructType(groupSchema.fields ++ Seq(schema(startColumn), schema(endColumn)) ++ sessionValues.fields)
  /** The default family: (group keys, start) -> (end, values), read by a prefix scan on the group keys. */
  override protected val keySchema: StructType = StructType(groupSchema.fields :+ schema(startColumn))
  override protected val valueSchema: StructType = StructType(schema(endColumn) +: sessionValues.fields)
  override protected val encoding: KeyStateEncoderSpec = PrefixKeyScanStateEncoderSpec(keySchema, groupColumns.length)
  private val byEndKeySchema = StructType(schema(endColumn) +: keySchema.fields)
  private val markerSchema = StructType(Seq(StructField("open", BooleanType)))
  override protected val families: Seq[Family] = Seq(
    Family(SessionStateStore.ByEnd, byEndKeySchema, markerSchema, RangeKeyScanStateEncoderSpec(byEndKeySchema, Seq(0))))
  override protected def routeColumns: Seq[String] = groupColumns.toIndexedSeq
  override protected def startMayGroup: Boolean = false

  override protected def rowMaker(): (UnsafeRow, UnsafeRow) => InternalRow = {
    val nG = groupColumns.length
    val groupOf = StoreSupport.columns(groupSchema.fields.map(_.dataType).toIndexedSeq, 0)
    val storedValues = StoreSupport.columns(sessionValues.fields.map(_.dataType).toIndexedSeq, 1)
    val toRow = UnsafeProjection.create(rowSchema)
    val two = new GenericInternalRow(2)
    val (j1, j2) = (new JoinedRow(), new JoinedRow())
    (key, value) => {
      two.setLong(0, key.getLong(nG))
      two.setLong(1, value.getLong(0))
      toRow(j2(j1(groupOf(key), two), storedValues(value)))
    }
  }

  /** Puts and removes sessions in both families (made in each task). */
  private final class Sessions(state: StateStore, puts: Puts) {
    def this(state: StateStore) = this(state, Puts.direct(state))
    private val toSessionKey = UnsafeProjection.create(keySchema)
    private val toSessionValue = UnsafeProjection.create(valueSchema)
    private val toByEndKey = UnsafeProjection.create(byEndKeySchema)
    private val marker = UnsafeProjection.create(markerSchema)(new GenericInternalRow(Array[Any](true))).copy()
    private val one = new GenericInternalRow(1)
    private val j1 = new JoinedRow()
    private def long(v: Long): InternalRow = { one.setLong(0, v); one }
    def key(group: InternalRow, start: Long): UnsafeRow = toSessionKey(j1(group, long(start))).copy()
    def byEndKey(end: Long, key: UnsafeRow): UnsafeRow = toByEndKey(j1(long(end), key))
    def put(group: InternalRow, start: Long, end: Long, values: InternalRow): Unit = {
      val k = key(group, start)
      puts.put(k, toSessionValue(j1(long(end), values)), StartLoad.Default)
      puts.put(byEndKey(end, k), marker, SessionStateStore.ByEnd)
    }
    def remove(group: InternalRow, start: Long, end: Long): Unit = {
      val k = key(group, start)
      state.remove(k)
      state.remove(byEndKey(end, k), SessionStateStore.ByEnd)
    }
  }

  /** Version 1: the handoff's sessions, merged already, each put as it comes. */
  override protected def putStart(state: StateStore, puts: Puts, rows: Iterator[InternalRow]): Unit = {
    val nG = groupColumns.length
    val groupOf = StoreSupport.columns(groupSchema.fields.map(_.dataType).toIndexedSeq, 0)
    val valuesOf = StoreSupport.columns(sessionValues.fields.map(_.dataType).toIndexedSeq, nG + 2)
    val sessions = new Sessions(state, puts)
    rows.foreach(row => sessions.put(groupOf(row), row.getLong(nG), row.getLong(nG + 1), valuesOf(row)))
  }

  /**
   * Merges `records` (rows of rowSchema: each record's own session [start, end)) into the store at `version`, then
   * removes and returns the sessions ending at or before `closeAtOrBelow` (null: none); commits version + 1.
   */
  def updateAndClose(
      records: DataFrame,
      combineSql: java.util.List[String],
      version: Long,
      closeAtOrBelow: java.lang.Long): StoreUpdate = {
    val (combine, pairAttrs) = StoreSupport.combineExpressions(spark, sessionValues, combineSql.asScala.toSeq)
    val nG = groupColumns.length
    val groupTypes = groupSchema.fields.map(_.dataType).toIndexedSeq
    val valueTypes = sessionValues.fields.map(_.dataType).toIndexedSeq
    val closing = closeAtOrBelow != null
    val bound: Long = if (closing) closeAtOrBelow.longValue() else Long.MinValue
    val byEnd = SessionStateStore.ByEnd
    val profile = new StoreProfile(spark.sparkContext)
    val rdd = inStore(routed(records), version) { (state, input) =>
      val started = System.nanoTime()
      val groupOf = StoreSupport.columns(groupTypes, 0)
      val valuesOf = StoreSupport.columns(valueTypes, nG + 2)
      val storedValues = StoreSupport.columns(valueTypes, 1)
      val groupOfKey = StoreSupport.columns(groupTypes, 1) // of a by_end key
      val combined = UnsafeProjection.create(combine, pairAttrs)
      val rowOf = rowMaker()
      val pair = new GenericInternalRow(2)
      val sessions = new Sessions(state)

      // The batch's rows per group key, in arrival order of the keys.
      val incoming = new java.util.LinkedHashMap[UnsafeRow, ArrayBuffer[OpenSession]]()
      input.foreach { row =>
        val group = groupOf(row).copy()
        val s = new OpenSession(row.getLong(nG), row.getLong(nG + 1), valuesOf(row).copy(), stored = false)
        incoming.computeIfAbsent(group, _ => ArrayBuffer[OpenSession]()) += s
      }
      incoming.forEach { (group, fresh) =>
        val stored = ArrayBuffer[OpenSession]()
        val it = state.prefixScan(group)
        try it.foreach { p =>
          stored += new OpenSession(p.key.getLong(nG), p.value.getLong(0), storedValues(p.value).copy(), stored = true)
        } finally it.close()
        // Spark's session rule over the key's open sessions and the new ones, in the order of their start.
        val merged = ArrayBuffer[MergedSession]()
        (stored ++ fresh).sortBy(_.start).foreach { s =>
          val current = merged.lastOption.orNull
          if (current != null && s.start <= current.end) {
            current.end = math.max(current.end, s.end)
            pair.update(0, current.values)
            pair.update(1, s.values)
            current.values = combined(pair).copy()
            current.touched = true
            current.members += s
          } else merged += new MergedSession(s)
        }
        // A merged session of one stored session alone is as it was: nothing to write.
        merged.filter(_.touched).foreach { m =>
          m.members.filter(_.stored).foreach(s => sessions.remove(group, s.start, s.end))
          sessions.put(group, m.start, m.end, m.values)
        }
      }
      val emitted = ArrayBuffer[InternalRow]()
      if (closing) {
        StoreBase.readUpTo(state.iterator(byEnd), 0, bound).foreach { case (endKey, _) =>
          val end = endKey.getLong(0)
          val start = endKey.getLong(nG + 1)
          val group = groupOfKey(endKey).copy()
          val key = sessions.key(group, start)
          val value = state.get(key)
          if (value == null) {
            throw new IllegalStateException(s"state store $checkpoint: the session ending at $end has no row")
          }
          emitted += rowOf(key, value).copy()
          sessions.remove(group, start, end)
        }
      }
      profile.commit(state, started)
      emitted.iterator
    }
    cached(rdd, version + 1, profile)
  }
}

object SessionStateStore {
  val ByEnd = "by_end"

  /** From Python: `spark._jsparkSession` (phases.spark_internals.java_session), the rows' schema as JSON. */
  def open(
      spark: org.apache.spark.sql.SparkSession,
      checkpoint: String,
      groupColumns: java.util.List[String],
      startColumn: String,
      endColumn: String,
      valueColumns: java.util.List[String],
      schemaJson: String,
      partitions: Int,
      runId: String): SessionStateStore =
    new SessionStateStore(spark.asInstanceOf[ClassicSession], checkpoint, groupColumns.asScala.toArray, startColumn,
      endColumn, valueColumns.asScala.toArray, StoreSupport.schemaOf(schemaJson), partitions, runId)
}
