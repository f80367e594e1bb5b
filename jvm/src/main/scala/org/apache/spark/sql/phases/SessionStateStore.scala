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
import org.apache.spark.storage.StorageLevel

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
 * update() takes and returns: group columns, `startColumn`, `endColumn`, value columns (`schema` has them all).
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
  val valueSchema: StructType = StructType(valueColumns.map(schema(_)))
  /** The rows update() takes and returns. */
  val rowSchema: StructType =
    StructType(groupSchema.fields ++ Seq(schema(startColumn), schema(endColumn)) ++ valueSchema.fields)
  private val sessionKeySchema = StructType(groupSchema.fields :+ schema(startColumn))
  private val sessionValueSchema = StructType(schema(endColumn) +: valueSchema.fields)
  private val byEndKeySchema = StructType(schema(endColumn) +: sessionKeySchema.fields)
  private val markerSchema = StructType(Seq(StructField("open", BooleanType)))

  /** Runs `f` in each store partition over `rows` (routed by the group columns) at `version`. */
  private def inStore(rows: DataFrame, version: Long)(
      f: (StateStore, Iterator[InternalRow]) => Iterator[InternalRow]) = {
    val session = sessionFor(version)
    val routed = StoreSupport.routed(rows, rowSchema.fieldNames.toIndexedSeq, groupColumns.toIndexedSeq, partitions,
      checkpoint)
    val byEnd = SessionStateStore.ByEnd
    val byEndSpec = RangeKeyScanStateEncoderSpec(byEndKeySchema, Seq(0))
    val (keySchema, markers) = (byEndKeySchema, markerSchema)
    routed.mapPartitionsWithStateStore(
      stateInfo(version), sessionKeySchema, sessionValueSchema,
      PrefixKeyScanStateEncoderSpec(sessionKeySchema, groupColumns.length), session.sessionState,
      Some(session.streams.stateStoreCoordinator), useColumnFamilies = true) { (state: StateStore, it: Iterator[InternalRow]) =>
      state.createColFamilyIfAbsent(byEnd, keySchema, markers, byEndSpec)
      f(state, it)
    }
  }

  /**
   * Merges `records` (rows of rowSchema: each record's own session [start, end), or handed-over sessions) into the
   * store at `version` and commits version + 1; `closeAtOrBelow` (null: none): the sessions ending at or before it are
   * then removed and returned. Version 0 (`emit` = false): the rows are the handoff's sessions, put as they are.
   */
  def update(
      records: DataFrame,
      combineSql: java.util.List[String],
      version: Long,
      emit: Boolean,
      closeAtOrBelow: java.lang.Long): StoreUpdate = {
    require(!emit, "a session store returns the sessions it closes, not the changed ones")
    val (combine, pairAttrs) = StoreSupport.combineExpressions(spark, valueSchema, combineSql.asScala.toSeq)
    val nG = groupColumns.length
    val groupTypes = groupSchema.fields.map(_.dataType).toIndexedSeq
    val valueTypes = valueSchema.fields.map(_.dataType).toIndexedSeq
    val closing = closeAtOrBelow != null
    val bound: Long = if (closing) closeAtOrBelow.longValue() else Long.MinValue
    val byEnd = SessionStateStore.ByEnd
    val (sessionKeys, sessionValues, byEndKeys, rows, markers) =
      (sessionKeySchema, sessionValueSchema, byEndKeySchema, rowSchema, markerSchema)
    val profile = new StoreProfile(spark.sparkContext)
    val rdd = inStore(records, version) { (state, input) =>
      val started = System.nanoTime()
      val groupOf = StoreSupport.columns(groupTypes, 0)
      val valuesOf = StoreSupport.columns(valueTypes, nG + 2)
      val storedValues = StoreSupport.columns(valueTypes, 1)
      val groupOfKey = StoreSupport.columns(groupTypes, 1) // of a by_end key
      val toSessionKey = UnsafeProjection.create(sessionKeys)
      val toSessionValue = UnsafeProjection.create(sessionValues)
      val toByEndKey = UnsafeProjection.create(byEndKeys)
      val toRow = UnsafeProjection.create(rows)
      val combined = UnsafeProjection.create(combine, pairAttrs)
      val marker = UnsafeProjection.create(markers)(new GenericInternalRow(Array[Any](true))).copy()
      val one = new GenericInternalRow(1)
      val two = new GenericInternalRow(2)
      val (j1, j2) = (new JoinedRow(), new JoinedRow())
      val pair = new GenericInternalRow(2)
      def long(v: Long): InternalRow = { one.setLong(0, v); one }
      def sessionKey(group: InternalRow, start: Long): UnsafeRow = toSessionKey(j1(group, long(start))).copy()
      def byEndKey(end: Long, key: UnsafeRow): UnsafeRow = toByEndKey(j1(long(end), key))
      def put(group: InternalRow, start: Long, end: Long, values: InternalRow): Unit = {
        val key = sessionKey(group, start)
        state.put(key, toSessionValue(j1(long(end), values)))
        state.put(byEndKey(end, key), marker, byEnd)
      }
      def remove(group: InternalRow, s: OpenSession): Unit = {
        val key = sessionKey(group, s.start)
        state.remove(key)
        state.remove(byEndKey(s.end, key), byEnd)
      }
      def out(group: InternalRow, start: Long, end: Long, values: InternalRow): InternalRow = {
        two.setLong(0, start)
        two.setLong(1, end)
        toRow(j2(j1(group, two), values)).copy()
      }

      // The batch's rows per group key, in arrival order of the keys. Version 0's rows are the handoff's sessions,
      // merged already: each is put as it comes, with nothing to gather.
      val incoming = new java.util.LinkedHashMap[UnsafeRow, ArrayBuffer[OpenSession]]()
      if (version == 0L) input.foreach(row => put(groupOf(row), row.getLong(nG), row.getLong(nG + 1), valuesOf(row)))
      else input.foreach { row =>
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
          m.members.filter(_.stored).foreach(s => remove(group, s))
          put(group, m.start, m.end, m.values)
        }
      }
      val emitted = ArrayBuffer[InternalRow]()
      if (closing) {
        val closed = ArrayBuffer[UnsafeRow]()
        val it = state.iterator(byEnd)
        try {
          var more = true
          while (more && it.hasNext) {
            val p = it.next()
            if (p.key.getLong(0) <= bound) closed += p.key.copy() else more = false
          }
        } finally it.close()
        closed.foreach { endKey =>
          val end = endKey.getLong(0)
          val start = endKey.getLong(nG + 1)
          val group = groupOfKey(endKey).copy()
          val key = sessionKey(group, start)
          val value = state.get(key)
          if (value == null) {
            throw new IllegalStateException(s"state store $checkpoint: the session ending at $end has no row")
          }
          emitted += out(group, start, end, storedValues(value))
          state.remove(key)
          state.remove(endKey, byEnd)
        }
      }
      profile.commit(state, started)
      emitted.iterator
    }
    val cached = rdd.persist(StorageLevel.MEMORY_AND_DISK)
    val closedCount = cached.count()
    new StoreUpdate(cached, StoreSupport.frameOf(spark, cached, rowSchema, closedCount), closedCount, version + 1,
      profile = profile)
  }

  /** Every open session of the store at `version` (nothing is committed). */
  def read(version: Long): DataFrame = {
    val nG = groupColumns.length
    val groupTypes = groupSchema.fields.map(_.dataType).toIndexedSeq
    val valueTypes = valueSchema.fields.map(_.dataType).toIndexedSeq
    val rows = rowSchema
    val nothing = spark.createDataFrame(spark.sparkContext.emptyRDD[org.apache.spark.sql.Row], rowSchema)
    val rdd = inStore(nothing, version) { (state, _) =>
      val groupOf = StoreSupport.columns(groupTypes, 0)
      val storedValues = StoreSupport.columns(valueTypes, 1)
      val toRow = UnsafeProjection.create(rows)
      val two = new GenericInternalRow(2)
      val (j1, j2) = (new JoinedRow(), new JoinedRow())
      val it = state.iterator()
      val out = try it.map { p =>
        two.setLong(0, p.key.getLong(nG))
        two.setLong(1, p.value.getLong(0))
        toRow(j2(j1(groupOf(p.key), two), storedValues(p.value))).copy(): InternalRow
      }.toArray finally it.close()
      state.abort()
      out.iterator
    }
    spark.internalCreateDataFrame(rdd, rowSchema)
  }
}

object SessionStateStore {
  val ByEnd = "by_end"

  /** From Python: `spark._jsparkSession`, the rows' schema as JSON. */
  def open(
      spark: org.apache.spark.sql.SparkSession,
      checkpoint: String,
      groupColumns: java.util.List[String],
      startColumn: String,
      endColumn: String,
      valueColumns: java.util.List[String],
      schemaJson: String,
      partitions: Int,
      runId: String): SessionStateStore = {
    val schema = org.apache.spark.sql.types.DataType.fromJson(schemaJson).asInstanceOf[StructType]
    new SessionStateStore(spark.asInstanceOf[ClassicSession], checkpoint, groupColumns.asScala.toArray, startColumn,
      endColumn, valueColumns.asScala.toArray, schema, partitions, runId)
  }
}
