/*
 * Version 1 of a store, loaded in bulk. A store's starting state (the handoff's rows, one per key) is written once,
 * into an empty store, and committed as a snapshot. A put per row through RocksDB's memtable cost ~2.4 us a key and
 * a flush at the commit; here each task encodes its rows with the store's own encoders (the bytes a put would write),
 * sorts them, writes them as SST files (RocksDB's SstFileWriter, with the store's own options) and has RocksDB ingest
 * the files. Spark's commit then checkpoints and uploads them as it would the flushed memtable.
 *
 * The RocksDB instance, the provider's encoders and the column-family prefix are Spark internals with no public API:
 * [[StartLoad.internals]] reaches them by reflection and names what it could not find;
 * tests/phases/test_keyed_store.py pins every one of them. A store that is not RocksDB's, or whose rows carry
 * checksums, takes the puts.
 */
package org.apache.spark.sql.phases

import java.io.File
import java.lang.reflect.Method
import java.util.{Arrays => JArrays}

import scala.util.control.NonFatal

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{RocksDB, RocksDBKeyStateEncoder, RocksDBStateStoreProvider,
  RocksDBValueStateEncoder, StateStore}
import org.rocksdb.{EnvOptions, IngestExternalFileOptions, SstFileWriter}

/** Where a store's rows go: a (key, value) of a column family (the store's put, or version 1's bulk load). */
trait Puts {
  def put(key: UnsafeRow, value: UnsafeRow, family: String): Unit

  /** Writes what is still held: once, after the last put and before the commit. */
  def finish(): Unit

  /** Figures for the store's profile (name -> value). */
  def figures: Seq[(String, Long)] = Nil
}

object Puts {
  /** The store's own put, a row at a time. */
  def direct(state: StateStore): Puts = new Puts {
    def put(key: UnsafeRow, value: UnsafeRow, family: String): Unit = state.put(key, value, family)
    def finish(): Unit = ()
  }
}

/** The Spark internals a bulk load needs, found on one store (reflection: none has a public API). */
final case class LoadInternals(
    rocks: RocksDB,
    db: org.rocksdb.RocksDB,
    options: org.rocksdb.Options,
    encoders: String => (RocksDBKeyStateEncoder, RocksDBValueStateEncoder),
    prefixed: Option[(Array[Byte], String) => Array[Byte]])

object StartLoad {
  val Default: String = StateStore.DEFAULT_COL_FAMILY_NAME

  /** Whether version 1 is loaded in bulk (`true`, the default) or put a row at a time (`false`). */
  val BulkConf = "spark.phases.storeBulkStart"

  /** Bytes of keys and values a task holds before it writes them as one SST file (64 MiB unless the session sets
   * another: tests set a small one to have a task write several overlapping files). */
  val ChunkConf = "spark.phases.storeBulkChunkBytes"
  val ChunkBytes: Long = 64L << 20

  private val ProviderClass = classOf[RocksDBStateStoreProvider]

  private def method(cls: Class[_], name: String, parameters: Class[_]*): Method = {
    val m = try cls.getDeclaredMethod(name, parameters: _*) catch {
      case _: NoSuchMethodException =>
        throw new IllegalStateException(s"Spark internal ${cls.getName}.$name(${parameters.map(_.getSimpleName)
          .mkString(", ")}) is gone: the state store's bulk start needs it (set $BulkConf=false to put rows instead)")
    }
    m.setAccessible(true)
    m
  }

  /** The provider's encoder map (a private field's accessor: its name is Scala's mangled one). */
  private lazy val EncoderMap: Method =
    method(ProviderClass, "org$apache$spark$sql$execution$streaming$state$RocksDBStateStoreProvider$$keyValueEncoderMap")
  private lazy val UsesFamilies: Method =
    method(ProviderClass, "org$apache$spark$sql$execution$streaming$state$RocksDBStateStoreProvider$$useColumnFamilies")
  private lazy val Db: Method = method(classOf[RocksDB], "db")
  private lazy val Options: Method = method(classOf[RocksDB], "rocksDbOptions")
  private lazy val Prefix: Method =
    method(classOf[RocksDB], "encodeStateRowWithPrefix", classOf[Array[Byte]], classOf[String])

  /** The internals of `state`'s RocksDB (None: another store provider). Throws, naming it, when one is gone. */
  def internals(state: StateStore): Option[LoadInternals] = {
    val outer = try Some(state.getClass.getField("$outer").get(state)) catch { case _: NoSuchFieldException => None }
    outer.collect { case provider: RocksDBStateStoreProvider =>
      val rocks = provider.rocksDB
      val map = EncoderMap.invoke(provider).asInstanceOf[java.util.concurrent.ConcurrentHashMap[String, Product]]
      val families = UsesFamilies.invoke(provider).asInstanceOf[Boolean]
      val encoders = (family: String) => {
        val found = map.get(family)
        require(found != null, s"state store ${state.id}: no encoders for the column family $family")
        (found.productElement(0).asInstanceOf[RocksDBKeyStateEncoder],
          found.productElement(1).asInstanceOf[RocksDBValueStateEncoder])
      }
      val prefixed = if (families) Some(new FamilyPrefixes(rocks, Prefix)) else None
      LoadInternals(rocks, Db.invoke(rocks).asInstanceOf[org.rocksdb.RocksDB],
        Options.invoke(rocks).asInstanceOf[org.rocksdb.Options], encoders, prefixed)
    }
  }

  /** The puts of version 1 into `state` (an empty store): in bulk, `chunkBytes` a file, when `bulk` and the store is
   * RocksDB's without row checksums, else a row at a time. */
  def of(state: StateStore, bulk: Boolean, chunkBytes: Long = ChunkBytes): Puts =
    (if (bulk) internals(state) else None) match {
      case Some(found) if !found.rocks.conf.rowChecksumEnabled => new BulkPuts(found, chunkBytes)
      case _ => Puts.direct(state)
    }

  /** The internals [[internals]] reaches that this Spark lacks, by name (empty: all there). For the test that pins
   * them before a backlog needs them. */
  def missingInternals(): java.util.List[String] = {
    val missing = new java.util.ArrayList[String]()
    def check(name: String)(find: => Any): Unit = try find catch { case NonFatal(e) => missing.add(s"$name: $e") }
    check("RocksDBStateStoreProvider$RocksDBStateStore.$outer") {
      Class.forName(ProviderClass.getName + "$RocksDBStateStore").getField("$outer")
    }
    check("RocksDBStateStoreProvider.keyValueEncoderMap")(EncoderMap)
    check("RocksDBStateStoreProvider.useColumnFamilies")(UsesFamilies)
    check("RocksDB.db")(Db)
    check("RocksDB.rocksDbOptions")(Options)
    check("RocksDB.encodeStateRowWithPrefix")(Prefix)
    missing
  }

  /** [[BulkPuts.sortedOrder]] of `keys` (for tests: Py4J passes a list). */
  def sortedOrder(keys: java.util.List[Array[Byte]]): Array[Int] = {
    val array = keys.toArray(new Array[Array[Byte]](0))
    BulkPuts.sortedOrder(array, array.length)
  }
}

/**
 * The bytes Spark's RocksDB puts before a key of a column family (`encodeStateRowWithPrefix`, private: called by
 * reflection). A family's prefix is learned once, from an empty key, and used as is when the same call on a probe
 * key gives that prefix and the probe; otherwise every key goes through the call.
 */
final class FamilyPrefixes(rocks: RocksDB, call: Method) extends ((Array[Byte], String) => Array[Byte]) {
  private val learned = new java.util.HashMap[String, Option[Array[Byte]]]()

  private def prefixed(key: Array[Byte], family: String): Array[Byte] =
    call.invoke(rocks, key, family).asInstanceOf[Array[Byte]]

  def apply(key: Array[Byte], family: String): Array[Byte] = {
    var known = learned.get(family)
    if (known == null) {
      val prefix = prefixed(Array.emptyByteArray, family)
      val probe = Array[Byte](7, 0, -1)
      known = if (JArrays.equals(prefixed(probe, family), prefix ++ probe)) Some(prefix) else None
      learned.put(family, known)
    }
    known match {
      case Some(prefix) =>
        val out = new Array[Byte](prefix.length + key.length)
        System.arraycopy(prefix, 0, out, 0, prefix.length)
        System.arraycopy(key, 0, out, prefix.length, key.length)
        out
      case None => prefixed(key, family)
    }
  }
}

/**
 * Puts held as encoded bytes, then written in key order as SST files that RocksDB ingests (a file each `chunkBytes`
 * of keys and values; files of one task may overlap, each ingested in turn). Of one key put twice the last value
 * stays, as with puts.
 */
final class BulkPuts(found: LoadInternals, chunkBytes: Long) extends Puts {
  private var keys = new Array[Array[Byte]](1024)
  private var values = new Array[Array[Byte]](1024)
  private var held = 0
  private var heldBytes = 0L
  private var files = 0L
  private var rows = 0L
  private var writeNanos = 0L
  private var sortNanos = 0L

  def put(key: UnsafeRow, value: UnsafeRow, family: String): Unit = {
    val (keyEncoder, valueEncoder) = found.encoders(family)
    val k0 = keyEncoder.encodeKey(key)
    val k = found.prefixed match {
      case Some(prefix) => prefix(k0, family)
      case None => k0.clone() // an encoder may hand back its row's own buffer, which the next row reuses
    }
    val v = valueEncoder.encodeValue(value).clone()
    if (held == keys.length) {
      keys = JArrays.copyOf(keys, held * 2)
      values = JArrays.copyOf(values, held * 2)
    }
    keys(held) = k
    values(held) = v
    held += 1
    heldBytes += k.length + v.length
    if (heldBytes >= chunkBytes) write()
  }

  def finish(): Unit = if (held > 0) write()

  override def figures: Seq[(String, Long)] =
    Seq("bulkRows" -> rows, "bulkFiles" -> files, "bulkWriteMs" -> writeNanos / 1000000L,
      "bulkSortMs" -> sortNanos / 1000000L)

  private def write(): Unit = {
    val started = System.nanoTime()
    val ks = keys
    val order = BulkPuts.sortedOrder(ks, held)
    sortNanos += System.nanoTime() - started
    val file = File.createTempFile("start-", ".sst", found.rocks.localRootDir)
    val env = new EnvOptions()
    val writer = new SstFileWriter(env, found.options)
    var written = 0L
    try {
      writer.open(file.getAbsolutePath)
      var i = 0
      while (i < held) {
        val at = order(i)
        val last = i + 1 == held || JArrays.compareUnsigned(ks(at), ks(order(i + 1))) != 0
        if (last) {
          writer.put(ks(at), values(at))
          written += 1
        }
        i += 1
      }
      writer.finish()
    } catch {
      case NonFatal(e) =>
        file.delete()
        throw e
    } finally {
      writer.close()
      env.close()
    }
    val options = new IngestExternalFileOptions().setMoveFiles(true)
    try found.db.ingestExternalFile(java.util.Collections.singletonList(file.getAbsolutePath), options)
    finally {
      options.close()
      file.delete() // moved into the store's files (a hard link); the name left behind
    }
    files += 1
    rows += written
    JArrays.fill(keys.asInstanceOf[Array[AnyRef]], 0, held, null)
    JArrays.fill(values.asInstanceOf[Array[AnyRef]], 0, held, null)
    held = 0
    heldBytes = 0L
    writeNanos += System.nanoTime() - started
  }
}

object BulkPuts {
  /**
   * The indexes of `keys(0 until n)` in RocksDB's order (bytewise, unsigned), stable: equal keys keep the order they
   * were put in. A comparison sort of byte arrays put in hash order costs a cache miss or two a comparison (0.6 s for
   * 500,000 keys); here the keys' common prefix is skipped, the next eight bytes, less the bits the index needs, are
   * packed with the index into a long and the longs sorted as primitives. Keys equal in those bytes (a run) are
   * sorted the same way from where they start to differ, until a run is small (insertion sort) or makes no progress
   * (equal keys, or keys of one length that differ late: a stable comparison sort).
   */
  def sortedOrder(keys: Array[Array[Byte]], n: Int): Array[Int] = {
    val order = Array.tabulate(n)(identity)
    sortRange(keys, order, 0, n, 0)
    order
  }

  private val Small = 16

  /** Sorts `order(from until to)` stably by the keys they index, all of which share their first `shared` bytes. */
  private def sortRange(keys: Array[Array[Byte]], order: Array[Int], from: Int, to: Int, shared: Int): Unit = {
    val n = to - from
    if (n <= Small) return insertionSort(keys, order, from, to)
    val first = keys(order(from))
    var common = first.length
    var i = from + 1
    while (i < to && common > shared) {
      // Bytes before `shared` are equal (a key shorter than that: equal up to its end, zeros after it).
      val k = keys(order(i))
      val len = math.min(common, k.length)
      val start = math.min(shared, len)
      val m = JArrays.mismatch(first, start, len, k, start, len)
      common = if (m < 0) len else start + m
      i += 1
    }
    common = math.max(common, shared)
    val indexBits = math.max(1, 32 - Integer.numberOfLeadingZeros(n - 1))
    val indexMask = (1L << indexBits) - 1
    val packed = new Array[Long](n)
    i = 0
    while (i < n) {
      val k = keys(order(from + i))
      var prefix = 0L
      var b = 0
      while (b < 8) {
        val at = common + b
        prefix = (prefix << 8) | (if (at < k.length) (k(at) & 0xffL) else 0L)
        b += 1
      }
      // The top bits of the unsigned prefix, sign-flipped so that a signed sort orders them unsigned.
      packed(i) = ((prefix & ~indexMask) ^ Long.MinValue) | i
      i += 1
    }
    JArrays.sort(packed)
    val sorted = new Array[Int](n)
    i = 0
    while (i < n) {
      sorted(i) = order(from + (packed(i) & indexMask).toInt)
      i += 1
    }
    System.arraycopy(sorted, 0, order, from, n)
    // The whole bytes the packed prefix compared: a run's keys agree on them too.
    val next = common + (64 - indexBits) / 8
    var start = 0
    while (start < n) {
      val run = packed(start) & ~indexMask
      var end = start + 1
      while (end < n && (packed(end) & ~indexMask) == run) end += 1
      if (end - start > 1) {
        if (end - start < n) sortRange(keys, order, from + start, from + end, common)
        // No split: on to the bytes after the compared ones, unless no key reaches past them (equal keys, or keys
        // that differ only in trailing zeros): then only a whole comparison orders them.
        else if (reachesPast(keys, order, from, to, next)) sortRange(keys, order, from, to, next)
        else stableSort(keys, order, from, to)
      }
      start = end
    }
  }

  /** Whether a key of `order(from until to)` is longer than `length` bytes. */
  private def reachesPast(keys: Array[Array[Byte]], order: Array[Int], from: Int, to: Int, length: Int): Boolean = {
    var i = from
    while (i < to) {
      if (keys(order(i)).length > length) return true
      i += 1
    }
    false
  }

  private def insertionSort(keys: Array[Array[Byte]], order: Array[Int], from: Int, to: Int): Unit = {
    var j = from + 1
    while (j < to) {
      val at = order(j)
      var k = j - 1
      while (k >= from && JArrays.compareUnsigned(keys(order(k)), keys(at)) > 0) {
        order(k + 1) = order(k)
        k -= 1
      }
      order(k + 1) = at
      j += 1
    }
  }

  private def stableSort(keys: Array[Array[Byte]], order: Array[Int], from: Int, to: Int): Unit = {
    val part = JArrays.copyOfRange(order, from, to).map(Int.box)
    JArrays.sort(part, (a: Integer, b: Integer) => JArrays.compareUnsigned(keys(a), keys(b)))
    var j = 0
    while (j < part.length) { order(from + j) = part(j); j += 1 }
  }
}
