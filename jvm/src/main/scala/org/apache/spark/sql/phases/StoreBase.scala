/*
 * What every state store of the engine is, whatever its layout: Spark's layout under `checkpoint` (operator 0),
 * `partitions` partitions a key always reaches the same one of, version 1 written once from the handoff's rows,
 * versions loaded by number, every row read back, and an unload when the live phase stops.
 *
 * The layouts (each a class of its own, with only the operations it supports):
 * - KeyedStateStore: key -> values combined by SQL, the changed keys returned (keyed aggregations);
 * - OrderedStateStore: the same, the keys in the order of a long key column, and the rows at or below a bound
 *   closed (removed and returned) in the same commit (windows, co-groups);
 * - SessionStateStore: a key's open sessions merged by Spark's session rule, closed by their end (sessions);
 * - RowStateStore: whole rows by key, looked up and replaced by the caller, timers indexed in time order (process
 *   functions, interval joins).
 *
 * This lives in a package under org.apache.spark.sql because the state store's entry points are Spark-internal
 * (private[sql] session members, the StateStoreOps of the state package). tests/phases/test_keyed_store.py pins
 * every internal class and signature used here and fails naming the one that changed.
 */
package org.apache.spark.sql.phases

import java.util.UUID

import scala.collection.mutable.ArrayBuffer

import org.apache.spark.rdd.RDD
import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.classic.{SparkSession => ClassicSession}
import org.apache.spark.sql.execution.streaming.operators.stateful.StatefulOperatorStateInfo
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.StructType
import org.apache.spark.storage.StorageLevel

/** What one update of a store produced: the rows it returns (cached until released), their count, the version it
 * committed, and the route its rows took to the store's partitions (StoreSupport.withRoutedRows). */
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

/** A column family beyond the default one: its name, key and value schemas and key encoding. */
final case class Family(name: String, keySchema: StructType, valueSchema: StructType, encoding: KeyStateEncoderSpec)

abstract class StoreBase(
    @transient protected val spark: ClassicSession,
    val checkpoint: String,
    val partitions: Int,
    runId: String) extends Serializable {

  require(partitions > 0, s"partitions must be positive, got $partitions")
  private val queryRunId = UUID.fromString(runId)
  @transient private lazy val liveSession: ClassicSession = StoreSupport.storeSession(spark, writeOnce = false)
  @transient private lazy val startSession: ClassicSession = StoreSupport.storeSession(spark, writeOnce = true)

  /** The rows the store takes and returns, in this order. */
  def rowSchema: StructType

  /** The default family's key and value schemas and key encoding. */
  protected def keySchema: StructType
  protected def valueSchema: StructType
  protected def encoding: KeyStateEncoderSpec

  /** The families beyond the default one. */
  protected def families: Seq[Family] = Nil

  /** The columns a row is routed by: a key always reaches the same store partition. */
  protected def routeColumns: Seq[String]

  /** Whether version 1's rows may reach the store without a shuffle when their plan shows them hash-partitioned by
   * the route columns (StoreSupport.withRoutedRows); false: always the shuffle. */
  protected def startMayGroup: Boolean = true

  /** Made in each task: a stored (key, value) of the default family as a row of [[rowSchema]]. */
  protected def rowMaker(): (UnsafeRow, UnsafeRow) => InternalRow

  /** Puts version 1's rows (of [[rowSchema]], one per key) into one partition of the empty `state` through `puts`. */
  protected def putStart(state: StateStore, puts: Puts, rows: Iterator[InternalRow]): Unit

  /** Runs `f` in each store partition over `routed` (in `partitions` partitions by [[routeColumns]]), with the
   * version the store holds after `version` updates loaded; `start`: the empty store, to write version 1. */
  protected def inStore(routed: RDD[InternalRow], version: Long, start: Boolean = false)(
      f: (StateStore, Iterator[InternalRow]) => Iterator[InternalRow]): RDD[InternalRow] = {
    require(start || version >= 1L, s"state store $checkpoint: version $version is not a live version (1 or later)")
    // Version 1's write runs under a provider of its own (a fresh run id: executors keep a provider per store and
    // run id with the settings it was created with), unloaded after its commit, and commits a snapshot.
    val session = if (start) startSession else liveSession
    val info = StatefulOperatorStateInfo(
      checkpoint, if (start) UUID.randomUUID() else queryRunId, 0L, if (start) 0L else version, partitions, None, None)
    val extra = families
    routed.mapPartitionsWithStateStore(info, keySchema, valueSchema, encoding, session.sessionState,
      Some(session.streams.stateStoreCoordinator), useColumnFamilies = extra.nonEmpty) {
      (state: StateStore, rows: Iterator[InternalRow]) =>
        extra.foreach(f => state.createColFamilyIfAbsent(f.name, f.keySchema, f.valueSchema, f.encoding))
        f(state, rows)
    }
  }

  /** Rows of [[rowSchema]], routed to the store's partitions by the shuffle. */
  protected def routed(rows: DataFrame, columns: Seq[String] = rowSchema.fieldNames.toIndexedSeq): RDD[InternalRow] =
    StoreSupport.routed(rows, columns, routeColumns, partitions, checkpoint)

  /** `rdd` cached and counted, as a StoreUpdate that committed `committed` (the version loaded, for a lookup). */
  protected def cached(rdd: RDD[InternalRow], committed: Long, profile: StoreProfile = null,
      route: String = "shuffled"): StoreUpdate = {
    val rows = rdd.persist(StorageLevel.MEMORY_AND_DISK)
    val n = try rows.count() catch {
      case e: Throwable =>
        rows.unpersist(blocking = false)
        throw e
    }
    new StoreUpdate(rows, StoreSupport.frameOf(spark, rows, rowSchema, n), n, committed, route, profile)
  }

  /**
   * Writes version 1 from `rows` (of [[rowSchema]], one per key: the handoff's state, or an older layout's) into the
   * empty store, whatever it held. The handoff's rows reach the store's partitions without a shuffle when they are
   * hash-partitioned by the route columns already (StoreSupport.withRoutedRows). Each task loads its rows in bulk,
   * as sorted SST files RocksDB ingests (StartLoad; `spark.phases.storeBulkStart=false`: a put per row).
   */
  def writeStart(rows: DataFrame): StoreUpdate = {
    val profile = new StoreProfile(spark.sparkContext)
    val bulk = spark.conf.get(StartLoad.BulkConf, "true").toBoolean
    val chunk = spark.conf.getOption(StartLoad.ChunkConf).map(_.toLong).getOrElse(StartLoad.ChunkBytes)
    StoreSupport.withRoutedRows(rows, rowSchema.fieldNames.toIndexedSeq, routeColumns, partitions, checkpoint,
      mayGroup = startMayGroup) { (routed, route) =>
      val written = inStore(routed, 0L, start = true) { (state, input) =>
        val started = System.nanoTime()
        val puts = StartLoad.of(state, bulk, chunk)
        putStart(state, puts, input)
        puts.finish()
        profile.commit(state, started, puts.figures)
        Iterator.empty
      }
      cached(written, 1L, profile, route)
    }
  }

  /** Every row of the store at `version` (nothing is committed). */
  def read(version: Long): DataFrame = {
    val nothing = spark.sparkContext.parallelize(Seq.empty[InternalRow], partitions)
    val rdd = inStore(nothing, version) { (state, _) =>
      val rowOf = rowMaker()
      val it = state.iterator()
      val rows = try it.map(p => rowOf(p.key, p.value).copy(): InternalRow).toArray finally it.close()
      state.abort()
      rows.iterator
    }
    spark.internalCreateDataFrame(rdd, rowSchema)
  }

  /**
   * Unloads this opening's providers (its run id) from the executors, as a stopped live phase's last step: each first
   * does its maintenance, which uploads the newest snapshot its commits queued (Spark's maintenance thread would, at
   * its next interval, 60 s by default), then closes and frees its memory. The next opening (a restart) then loads a
   * recent snapshot instead of replaying every changelog since the last upload. One task per partition, placed where
   * the coordinator last saw it loaded; a partition loaded nowhere (nothing run, or an executor lost) is skipped.
   * Returns the providers unloaded.
   */
  def unload(): Int = {
    val coordinator = liveSession.streams.stateStoreCoordinator
    val placed = (0 until partitions).map { p =>
      val id = StateStoreProviderId(StateStoreId(checkpoint, 0L, p), queryRunId)
      (id, coordinator.getLocation(id).toSeq)
    }
    spark.sparkContext.makeRDD(placed).map { id =>
      if (StateStore.isLoaded(id)) {
        StateStore.doMaintenanceAndUnload(id)
        1
      } else 0
    }.collect().sum
  }
}

object StoreBase {
  /**
   * The close loop every ordered read shares: from the start of `it` (keys in the order of the long at `orderAt`),
   * the (key, value) pairs whose order value is at or below `bound`, copied, up to the first greater one. `it` is
   * closed.
   */
  def readUpTo(it: StateStoreIterator[UnsafeRowPair], orderAt: Int, bound: Long): ArrayBuffer[(UnsafeRow, UnsafeRow)] = {
    val found = ArrayBuffer[(UnsafeRow, UnsafeRow)]()
    try {
      var more = true
      while (more && it.hasNext) {
        val p = it.next()
        if (p.key.getLong(orderAt) <= bound) found += ((p.key.copy(), p.value.copy())) else more = false
      }
    } finally it.close()
    found
  }
}
