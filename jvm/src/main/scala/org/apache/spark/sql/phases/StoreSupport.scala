/*
 * What the engine's state stores share besides their base (StoreBase.scala): the session their SQL conf comes from,
 * rows routed to store partitions the way repartition(n, keys) routes them, the combine expressions analysed once on
 * the driver, and each update's profile.
 */
package org.apache.spark.sql.phases

import org.apache.spark.{SparkContext, SparkException}
import org.apache.spark.rdd.{PartitionCoalescer, PartitionGroup, RDD}
import org.apache.spark.sql.{DataFrame, Row}
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{Alias, Attribute, BoundReference, Expression, UnsafeProjection}
import org.apache.spark.sql.catalyst.plans.logical.{Project, Statistics}
import org.apache.spark.sql.catalyst.plans.logical.statsEstimation.EstimationUtils
import org.apache.spark.sql.catalyst.plans.physical.HashPartitioning
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.classic.{Dataset => ClassicDataset, SparkSession => ClassicSession}
import org.apache.spark.sql.execution.{CollectMetricsExec, FilterExec, InputAdapter, LogicalRDD, ProjectExec,
  SparkPlan, WholeStageCodegenExec}
import org.apache.spark.sql.execution.adaptive.{AdaptiveSparkPlanExec, QueryStageExec}
import org.apache.spark.sql.execution.columnar.InMemoryTableScanExec
import org.apache.spark.sql.execution.exchange.Exchange
import org.apache.spark.sql.execution.streaming.state.StateStore
import org.apache.spark.sql.functions.col
import org.apache.spark.sql.types.{DataType, StructField, StructType}

object StoreSupport {
  val RocksDBProvider = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
  val BlockCacheConf = "spark.sql.streaming.stateStore.rocksdb.blockCacheSizeMB"
  val BlockCacheMB = 64

  /** A DataFrame over `rows` (materialized: `count` rows) whose plan states its row count and size, as a cached
   * relation's does. `internalCreateDataFrame` states none (Spark then assumes the largest size), so a statement
   * joining the frame to a table plans a sort-merge join and shuffles the whole table where broadcasting the frame
   * would do (a live micro-batch's MERGE of 2,000 changed keys into a 1M-row sink shuffled all 1M rows). */
  def frameOf(spark: ClassicSession, rows: RDD[InternalRow], schema: StructType, count: Long): DataFrame = {
    val output = DataTypeUtils.toAttributes(schema)
    val stats = Statistics(sizeInBytes = EstimationUtils.getSizePerRow(output) * count, rowCount = Some(count))
    ClassicDataset.ofRows(spark, LogicalRDD(output, rows)(spark, Some(stats)))
  }

  /** A session whose SQL conf the store reads: RocksDB with changelog checkpointing (a commit writes the changed
   * keys only; snapshots are uploaded by Spark's maintenance thread). `writeOnce`: version 1's write, whose provider
   * is unloaded after its commit instead of holding the whole store in memory, and which commits a snapshot. */
  def storeSession(spark: ClassicSession, writeOnce: Boolean): ClassicSession = {
    val s = spark.cloneSession()
    s.conf.set("spark.sql.streaming.stateStore.providerClass", RocksDBProvider)
    s.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    // Counting the store's rows costs RocksDB a read before every write; nothing here needs the count.
    s.conf.set("spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows", "false")
    if (!spark.conf.contains(BlockCacheConf)) s.conf.set(BlockCacheConf, BlockCacheMB.toString)
    if (writeOnce) {
      s.conf.set("spark.sql.streaming.stateStore.unloadOnCommit", "true")
      // Version 1 is a snapshot (its SST files), not a changelog: a changelog of every key would be replayed, one
      // put per key, by every load of the store until Spark's maintenance uploads a snapshot ten versions later
      // (the first live micro-batch after the switch and every restart: 1.2 s of task time at 1M keys). A store
      // mixes both: a load takes the newest snapshot at or below the version, then replays the changelogs after it.
      s.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "false")
    }
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

  /** A row the grouped route (below) found in a store partition its keys do not hash to. */
  val Misrouted = "row in a store partition its keys do not hash to"

  /** How rows reach the store's partitions: `auto` (grouped when the plan shows it applies, else shuffled),
   * `shuffle` (always), `group` (grouped whatever the plan shows, still checked row by row: for tests). */
  val RouteConf = "spark.phases.storeRoute"
  val Routes = Seq("auto", "shuffle", "group")

  /**
   * Runs `run` over `rows`' `columns` in `partitions` store partitions by the hash of the `by` columns, the way
   * `repartition(partitions, by)` routes them, but without a shuffle when the rows already are in `k * partitions`
   * hash partitions of exactly the `by` columns (the backlog's aggregation by key, cached): store partition `j` then
   * takes the row partitions `i` with `i % partitions == j`, since pmod(h, k * n) % n == pmod(h, n). Each of those
   * tasks checks every row's partition by Spark's own rule; a row elsewhere fails the attempt, which is then run
   * again over the shuffle (an update that fails commits no version that a progress record names, and a replay
   * rewrites the version it failed to write). `run` gets the rows and the route they took. `mayGroup` = false: always
   * the shuffle (a live micro-batch's rows come from a plan that has not run, whose partitions adaptive execution may
   * still merge; looking is not worth its planning there).
   */
  def withRoutedRows[T](
      rows: DataFrame,
      columns: Seq[String],
      by: Seq[String],
      partitions: Int,
      store: String,
      mayGroup: Boolean)(run: (RDD[InternalRow], String) => T): T = {
    val route = rows.sparkSession.conf.get(RouteConf, "auto")
    require(Routes.contains(route), s"$RouteConf is '$route'; valid values: ${Routes.mkString(", ")}")
    val group = route match {
      case _ if !mayGroup => None
      case "shuffle" => None
      case "group" => grouped(rows, columns, by, partitions, force = true)
      case _ => grouped(rows, columns, by, partitions, force = false)
    }
    group match {
      case Some(rdd) =>
        try run(rdd, "grouped") catch {
          case e: SparkException if causes(e).exists(c => Option(c.getMessage).exists(_.contains(Misrouted))) =>
            run(routed(rows, columns, by, partitions, store), "shuffled after a misrouted row")
        }
      case None => run(routed(rows, columns, by, partitions, store), "shuffled")
    }
  }

  private def causes(e: Throwable): Iterator[Throwable] = Iterator.iterate(e)(_.getCause).takeWhile(_ != null).take(20)

  /** The grouped route of [[withRoutedRows]] when the plan of `rows` shows it applies (None: shuffle). */
  private def grouped(
      rows: DataFrame,
      columns: Seq[String],
      by: Seq[String],
      partitions: Int,
      force: Boolean): Option[RDD[InternalRow]] = {
    val ds = rows.select(columns.map(n => col(s"`$n`")): _*).asInstanceOf[ClassicDataset[Row]]
    // The executed plan's own attributes (the optimizer drops aliases that only rename, and their ids with them).
    val plan = ds.queryExecution.executedPlan
    val keys = by.map(n => plan.output(columns.indexOf(n)))
    val shown = if (force) Some(-1) else hashPartitions(plan, keys, settled = true)
    shown match {
      case Some(m) if force || (m >= partitions && m % partitions == 0) =>
        val source = ds.queryExecution.toRdd
        if (!force && source.getNumPartitions != m) None
        else {
          val keyTypes = keys.map(_.dataType)
          val keyOrdinals = by.map(columns.indexOf)
          val checked = source.coalesce(partitions, shuffle = false, Some(new ModuloCoalescer(partitions)))
            .mapPartitionsWithIndex { (j, it) =>
              val partitionOf = UnsafeProjection.create(Seq(
                HashPartitioning(keyOrdinals.zip(keyTypes).map { case (o, t) => BoundReference(o, t, nullable = true) },
                  partitions).partitionIdExpression))
              it.map { row =>
                if (partitionOf(row).getInt(0) != j) {
                  throw new IllegalStateException(s"$Misrouted: store partition $j")
                }
                row
              }
            }
          Some(checked)
        }
      case _ => None
    }
  }

  /**
   * The number of hash partitions of exactly `keys` (in order) the rows of `plan` are in, as far as the plan shows it
   * through what adaptive execution and the cache wrap around it (None: not shown). `settled`: no exchange below
   * can still be replaced (an adaptive plan that has not run may coalesce its shuffles when it runs).
   */
  private[phases] def hashPartitions(plan: SparkPlan, keys: Seq[Attribute], settled: Boolean): Option[Int] = plan match {
    case a: AdaptiveSparkPlanExec => hashPartitions(a.executedPlan, keys, settled && a.isFinalPlan)
    case q: QueryStageExec => hashPartitions(q.plan, keys, settled)
    case w: WholeStageCodegenExec => hashPartitions(w.child, keys, settled)
    case i: InputAdapter => hashPartitions(i.child, keys, settled)
    case c: CollectMetricsExec => hashPartitions(c.child, keys, settled)
    case f: FilterExec => hashPartitions(f.child, keys, settled)
    case p: ProjectExec =>
      val sources = keys.map { k =>
        p.projectList.collectFirst {
          case a: Attribute if a.exprId == k.exprId => a
          case al @ Alias(a: Attribute, _) if al.exprId == k.exprId => a
        }
      }
      if (sources.forall(_.isDefined)) hashPartitions(p.child, sources.flatten, settled) else None
    case s: InMemoryTableScanExec =>
      // The cached plan ran when the cache was built: it is settled whatever this plan's state.
      val relation = s.relation
      val at = keys.map(k => relation.output.indexWhere(_.exprId == k.exprId))
      if (at.exists(_ < 0)) None
      else hashPartitions(relation.cachedPlan, at.map(relation.cachedPlan.output), settled = true)
    case other if !settled && other.exists(_.isInstanceOf[Exchange]) => None
    case other => other.outputPartitioning match {
      case h: HashPartitioning
          if h.expressions.length == keys.length && h.expressions.zip(keys).forall { case (e, k) => e.semanticEquals(k) } =>
        Some(h.numPartitions)
      case _ => None
    }
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

  /** A schema passed from Python as JSON (`StructType.json()`). */
  def schemaOf(json: String): StructType = DataType.fromJson(json).asInstanceOf[StructType]

  /** A projection of the columns of `types`, read from ordinal `from` on. */
  def columns(types: Seq[DataType], from: Int): UnsafeProjection =
    UnsafeProjection.create(types.zipWithIndex.map { case (t, i) =>
      BoundReference(from + i, t, nullable = true): Expression })
}

/**
 * Where one store update's task time went, summed over its tasks: each task's time in its rows (`rowsMs`: reading
 * them, which includes the shuffle read, combining them, the store's gets and puts) and in its commit (`commitMs`),
 * and every figure the provider reports for the task after its commit (RocksDB: `rocksdbLoadLatencyMs`,
 * `rocksdbGetLatency`, `rocksdbPutLatency`, `rocksdbGetCount`, `rocksdbReadBlockCacheMissCount`, the commit's
 * steps, ...; `StateStore.metrics`). Task attempts that fail add nothing; a recomputed partition adds again.
 */
final class StoreProfile(sc: SparkContext) extends Serializable {
  // Unnamed: a named accumulator's values go to every task's row in the UI and the event log, on each micro-batch.
  private val figures = sc.collectionAccumulator[(String, Long)]

  /** Commits `state` for a task whose rows' work began at `started` (System.nanoTime), and records its figures. */
  def commit(state: StateStore, started: Long, more: Seq[(String, Long)] = Nil): Unit = {
    val committing = System.nanoTime()
    state.commit()
    record(state, committing - started, System.nanoTime() - committing)
    more.foreach(figures.add)
  }

  private def record(state: StateStore, rowsNanos: Long, commitNanos: Long): Unit = {
    figures.add("tasks" -> 1L)
    figures.add("rowsMs" -> rowsNanos / 1000000L)
    figures.add("commitMs" -> commitNanos / 1000000L)
    state.metrics.customMetrics.foreach { case (metric, value) => figures.add(metric.name -> value) }
  }

  /** The figures so far, summed over the tasks, by name. */
  def summed: java.util.Map[String, java.lang.Long] = {
    val sums = new java.util.TreeMap[String, java.lang.Long]()
    figures.value.forEach { case (name, value) => sums.merge(name, value, (a, b) => a + b) }
    sums
  }
}

object StoreProfile {
  /** A combining update's figure: the keys it added to the store (not there at the version it loaded). */
  val NewKeys = "newKeys"
}

/** Groups partition `i` of the parent into partition `i % n` (the grouped route of [[StoreSupport.withRoutedRows]]). */
class ModuloCoalescer(n: Int) extends PartitionCoalescer with Serializable {
  override def coalesce(maxPartitions: Int, parent: RDD[_]): Array[PartitionGroup] = {
    val groups = Array.fill(n)(new PartitionGroup())
    parent.partitions.foreach(p => groups(p.index % n).partitions += p)
    groups
  }
}
