/*
 * The combining stores: key -> values, a batch's values combined into a key's stored ones by SQL expressions bound in
 * the JVM (the backlog's merge; no Python per record). KeyedStateStore returns the changed keys (keyed aggregations);
 * OrderedStateStore keeps the keys in the order of a long key column and closes the rows at or below a bound in the
 * same commit (windows by their end, co-groups).
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
import org.apache.spark.sql.types.{LongType, StructType}

/**
 * A combining store at `checkpoint`: rows = key columns, then value columns; `partitions` partitions hashed the way
 * `repartition(partitions, keys)` hashes. Version v is the state after `v` updates; an update at v loads v and commits
 * v + 1 (a replayed update loads the same v and writes the same v + 1).
 */
abstract class CombiningStore(
    session: ClassicSession,
    path: String,
    val keyColumns: Array[String],
    val valueColumns: Array[String],
    val schema: StructType,
    storePartitions: Int,
    runId: String) extends StoreBase(session, path, storePartitions, runId) {

  private val missing = (keyColumns ++ valueColumns).filterNot(schema.fieldNames.contains)
  require(missing.isEmpty, s"columns ${missing.mkString(", ")} are not in ${schema.simpleString}")

  override protected val keySchema: StructType = StructType(keyColumns.map(schema(_)))
  override protected val valueSchema: StructType = StructType(valueColumns.map(schema(_)))
  /** The rows an update takes and returns: keys, then values. */
  override val rowSchema: StructType = StructType(keySchema.fields ++ valueSchema.fields)
  override protected def routeColumns: Seq[String] = keyColumns.toIndexedSeq

  override protected def rowMaker(): (UnsafeRow, UnsafeRow) => InternalRow = {
    val joined = new JoinedRow()
    val out = UnsafeProjection.create(rowSchema)
    (key, value) => out(joined(key, value))
  }

  override protected def putStart(state: StateStore, puts: Puts, rows: Iterator[InternalRow]): Unit = {
    val keyOf = StoreSupport.columns(keySchema.fields.map(_.dataType).toIndexedSeq, 0)
    val valueOf = StoreSupport.columns(valueSchema.fields.map(_.dataType).toIndexedSeq, keyColumns.length)
    rows.foreach(row => puts.put(keyOf(row), valueOf(row), StartLoad.Default))
  }

  /**
   * Combines `partials` (keys + values; several rows of a key combine in turn) into the store at `version` and
   * commits version + 1. `combineSql` per value column: SQL over `t.<column>` (the stored value) and `s.<column>`
   * (the partial); a key not in the store takes the partial as it is. `emit`: the changed keys' new rows are returned
   * (each key once, after its partition); then `close` runs in the same task, before the commit, and returns its rows.
   */
  protected def combine(
      partials: DataFrame,
      combineSql: java.util.List[String],
      version: Long,
      emit: Boolean)(close: StateStore => Seq[InternalRow]): StoreUpdate = {
    val (combine, pairAttrs) = StoreSupport.combineExpressions(spark, valueSchema, combineSql.asScala.toSeq)
    val nKeys = keyColumns.length
    val keyTypes = keySchema.fields.map(_.dataType).toIndexedSeq
    val valueTypes = valueSchema.fields.map(_.dataType).toIndexedSeq
    val rowTypes = rowSchema.fields.map(_.dataType).toIndexedSeq
    val profile = new StoreProfile(spark.sparkContext)
    val rdd = inStore(routed(partials), version) { (state, rows) =>
      val keyOf = StoreSupport.columns(keyTypes, 0)
      val valueOf = StoreSupport.columns(valueTypes, nKeys)
      val combined = UnsafeProjection.create(combine, pairAttrs)
      val out = StoreSupport.columns(rowTypes, 0)
      val pair = new GenericInternalRow(2)
      val joined = new JoinedRow()
      // Several rows of one key (records lifted one by one) combine in turn; each key is emitted once, with its value
      // after the whole partition. When emitting, each touched key's newest value is kept here: a key's next row
      // combines with it without reading the store, the key is put once, after the partition, and the emit reads
      // nothing back. Without emitting (closing updates), each row is put as it comes, and nothing is held.
      val latest = new java.util.LinkedHashMap[UnsafeRow, UnsafeRow]()
      val started = System.nanoTime()
      var newKeys = 0L // keys the store did not hold before this update
      rows.foreach { row =>
        val key = keyOf(row)
        val partial = valueOf(row)
        val seen = if (emit) latest.get(key) else null
        val stored = if (seen != null) seen else state.get(key)
        if (stored == null) newKeys += 1
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
      emitted ++= close(state)
      profile.commit(state, started, Seq(StoreProfile.NewKeys -> newKeys))
      emitted.iterator
    }
    cached(rdd, version + 1, profile)
  }
}

/** Key -> values combined by SQL; an update returns the changed keys' new rows (keyed aggregations). */
class KeyedStateStore(
    session: ClassicSession,
    path: String,
    keyColumns: Array[String],
    valueColumns: Array[String],
    schema: StructType,
    storePartitions: Int,
    runId: String)
  extends CombiningStore(session, path, keyColumns, valueColumns, schema, storePartitions, runId) {

  override protected val encoding: KeyStateEncoderSpec = NoPrefixKeyStateEncoderSpec(keySchema)

  /** Combines `partials` into the store at `version`, commits version + 1 and returns the changed keys' new rows. */
  def update(partials: DataFrame, combineSql: java.util.List[String], version: Long): StoreUpdate =
    combine(partials, combineSql, version, emit = true)(_ => Nil)
}

/**
 * As KeyedStateStore, the keys stored in the order of the long key column `orderColumn` (Spark's range-scan key
 * encoding), so that an update closes the rows whose order value is at or below a bound by reading from the start of
 * each partition until the first greater one (windows by their end), not by a scan of the whole store.
 */
class OrderedStateStore(
    session: ClassicSession,
    path: String,
    keyColumns: Array[String],
    valueColumns: Array[String],
    schema: StructType,
    storePartitions: Int,
    runId: String,
    val orderColumn: String)
  extends CombiningStore(session, path, keyColumns, valueColumns, schema, storePartitions, runId) {

  /** The ordinal of the order column among the key columns. */
  val orderOrdinal: Int = keyColumns.indexOf(orderColumn)
  require(orderOrdinal >= 0, s"the order column $orderColumn is not a key column (${keyColumns.mkString(", ")})")
  require(schema(orderColumn).dataType == LongType,
    s"the order column $orderColumn must be a long, not ${schema(orderColumn).dataType.simpleString}")

  override protected val encoding: KeyStateEncoderSpec = RangeKeyScanStateEncoderSpec(keySchema, Seq(orderOrdinal))

  /**
   * Combines `partials` into the store at `version` without returning them; then every row whose order column is at
   * or below `closeAtOrBelow` (null: none) is removed and returned (its value with this update's combined in); commits
   * version + 1.
   */
  def updateAndClose(
      partials: DataFrame,
      combineSql: java.util.List[String],
      version: Long,
      closeAtOrBelow: java.lang.Long): StoreUpdate = {
    val closing = closeAtOrBelow != null
    val bound: Long = if (closing) closeAtOrBelow.longValue() else Long.MinValue
    val orderAt = orderOrdinal
    val types = rowSchema.fields.map(_.dataType).toIndexedSeq
    combine(partials, combineSql, version, emit = false) { state =>
      if (!closing) Nil
      else {
        val out = StoreSupport.columns(types, 0)
        val joined = new JoinedRow()
        val closed = StoreBase.readUpTo(state.iterator(), orderAt, bound)
        closed.foreach { case (key, _) => state.remove(key) }
        closed.map { case (key, value) => out(joined(key, value)).copy(): InternalRow }.toSeq
      }
    }
  }
}

object KeyedStateStore {
  /** From Python: `spark._jsparkSession` (phases.spark_internals.java_session), the rows' schema as JSON. */
  def open(
      spark: org.apache.spark.sql.SparkSession,
      checkpoint: String,
      keyColumns: java.util.List[String],
      valueColumns: java.util.List[String],
      schemaJson: String,
      partitions: Int,
      runId: String): KeyedStateStore =
    new KeyedStateStore(spark.asInstanceOf[ClassicSession], checkpoint, keyColumns.asScala.toArray,
      valueColumns.asScala.toArray, StoreSupport.schemaOf(schemaJson), partitions, runId)
}

object OrderedStateStore {
  /** As KeyedStateStore.open, the keys in the order of the long key column `orderColumn`. */
  def open(
      spark: org.apache.spark.sql.SparkSession,
      checkpoint: String,
      keyColumns: java.util.List[String],
      valueColumns: java.util.List[String],
      schemaJson: String,
      partitions: Int,
      runId: String,
      orderColumn: String): OrderedStateStore =
    new OrderedStateStore(spark.asInstanceOf[ClassicSession], checkpoint, keyColumns.asScala.toArray,
      valueColumns.asScala.toArray, StoreSupport.schemaOf(schemaJson), partitions, runId, orderColumn)
}
