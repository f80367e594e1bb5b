package org.apache.spark.sql.phases

import java.math.{BigDecimal => JBigDecimal, BigInteger}
import java.nio.ByteBuffer
import java.time.{Instant, LocalDate, LocalDateTime, ZoneOffset}

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import com.google.protobuf.{ByteString, CodedInputStream, DescriptorProtos, DynamicMessage, InvalidProtocolBufferException, Message}
import com.google.protobuf.Descriptors.{Descriptor, EnumValueDescriptor, FieldDescriptor, FileDescriptor}
import com.google.protobuf.Descriptors.FieldDescriptor.JavaType

import org.apache.spark.sql.{Column, Row}
import org.apache.spark.sql.api.java.UDF1
import org.apache.spark.sql.functions
import org.apache.spark.sql.types._

/** Protobuf records in the Confluent wire format (a zero magic byte, the schema id in 4 bytes big-endian, the message
  * indexes as zig-zag varints, the Protobuf binary encoding), decoded and encoded in the JVM: Spark 4.2's own
  * spark-protobuf is not published on Maven Central. The schemas arrive as serialized FileDescriptorSets (compiled by
  * the engine's Python side from the registry's .proto texts, imports included).
  *
  * Types: int32/sint32/sfixed32 are integers; uint32/fixed32 longs; int64/sint64/sfixed64 longs; uint64/fixed64
  * decimal(20,0); float, double, bool, string; bytes binary; an enum its value's name; a message a struct;
  * google.protobuf.Timestamp a timestamp; the google.protobuf wrappers their value, null when absent; repeated fields
  * arrays; map fields maps. A field with presence (a message, `optional`, a oneof member, proto2) that is absent is
  * null; a proto3 scalar without presence reads as its default, as Protobuf defines it. A recursive message has no
  * Spark type and is refused.
  */
object ProtobufRecords {

  private val WRAPPERS = Set("DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value", "UInt32Value",
    "BoolValue", "StringValue", "BytesValue").map("google.protobuf." + _)
  private val TIMESTAMP = "google.protobuf.Timestamp"
  val TOMBSTONE = "undecodable: null value (a tombstone)"
  val NOT_WIRE = "undecodable: not the Confluent wire format (a zero magic byte, then a 4-byte schema id)"

  /** A record that cannot be read as the reader type; its message is the quarantine reason. */
  final class Undecodable(message: String) extends RuntimeException(message, null, false, false)

  // --- descriptors ----------------------------------------------------------------------------------------------

  /** The files of a serialized FileDescriptorSet by name, each built after the files it imports. */
  def files(set: Array[Byte]): Map[String, FileDescriptor] = {
    val protos = DescriptorProtos.FileDescriptorSet.parseFrom(set).getFileList.asScala.map(p => p.getName -> p).toMap
    val built = mutable.Map[String, FileDescriptor]()
    def build(name: String, path: List[String]): FileDescriptor = built.getOrElse(name, {
      if (path.contains(name)) {
        throw new IllegalArgumentException(s"the schema's imports form a cycle: ${(name :: path).reverse.mkString(" -> ")}")
      }
      val proto = protos.getOrElse(name,
        throw new IllegalArgumentException(s"the schema imports $name, which is not among its references"))
      val deps = proto.getDependencyList.asScala.map(d => build(d, name :: path)).toArray
      val file = FileDescriptor.buildFrom(proto, deps)
      built(name) = file
      file
    })
    protos.keys.foreach(build(_, Nil))
    built.toMap
  }

  /** The message of `file` named `name` (its full name, or its name within the file's package); "" = the file's first. */
  def messageNamed(file: FileDescriptor, name: String): Descriptor = {
    val all = file.getMessageTypes.asScala
    if (all.isEmpty) throw new IllegalArgumentException(s"${file.getName} declares no message")
    if (name.isEmpty) all.head
    else {
      def nested(d: Descriptor): Seq[Descriptor] = d +: d.getNestedTypes.asScala.toSeq.flatMap(nested)
      val found = all.toSeq.flatMap(nested).find(d => d.getFullName == name || d.getFullName == s"${file.getPackage}.$name")
      found.getOrElse(throw new IllegalArgumentException(
        s"${file.getName} has no message $name (its messages: ${all.toSeq.flatMap(nested).map(_.getFullName).mkString(", ")})"))
    }
  }

  /** The message at the Confluent index path `indexes` of `file` (the first index: a top-level message). */
  def messageAt(file: FileDescriptor, indexes: Seq[Int]): Option[Descriptor] = {
    val top = file.getMessageTypes
    if (indexes.isEmpty || indexes.head < 0 || indexes.head >= top.size) None
    else indexes.tail.foldLeft(Option(top.get(indexes.head))) { (d, i) =>
      d.flatMap(m => if (i >= 0 && i < m.getNestedTypes.size) Some(m.getNestedTypes.get(i)) else None)
    }
  }

  /** The Confluent index path of `message` in its file. */
  def indexesOf(message: Descriptor): Seq[Int] = {
    Option(message.getContainingType) match {
      case Some(parent) => indexesOf(parent) :+ parent.getNestedTypes.indexOf(message)
      case None => Seq(message.getFile.getMessageTypes.indexOf(message))
    }
  }

  // --- Spark types ---------------------------------------------------------------------------------------------

  /** The Spark type of message `message` (see messageNamed) of file `file` in `set`, as JSON. */
  def sparkTypeJson(set: Array[Byte], file: String, message: String): String = {
    val fd = files(set).getOrElse(file, throw new IllegalArgumentException(s"no file $file in the descriptor set"))
    structOf(messageNamed(fd, message), Nil).json
  }

  def structOf(d: Descriptor, seen: List[String]): StructType = {
    if (seen.contains(d.getFullName)) {
      throw new IllegalArgumentException(
        s"message ${d.getFullName} is recursive (${(d.getFullName :: seen).reverse.mkString(" -> ")}): a Spark " +
          "column cannot hold it")
    }
    StructType(d.getFields.asScala.toSeq.map { f =>
      StructField(f.getName, typeOf(f, d.getFullName :: seen), nullable = !f.isRepeated || f.isMapField)
    })
  }

  def typeOf(f: FieldDescriptor, seen: List[String]): DataType = {
    if (f.isMapField) {
      val entry = f.getMessageType
      MapType(scalar(entry.findFieldByName("key"), seen), scalar(entry.findFieldByName("value"), seen),
        valueContainsNull = entry.findFieldByName("value").getJavaType == JavaType.MESSAGE)
    } else if (f.isRepeated) ArrayType(scalar(f, seen), containsNull = false)
    else scalar(f, seen)
  }

  private def scalar(f: FieldDescriptor, seen: List[String]): DataType = f.getType match {
    case FieldDescriptor.Type.INT32 | FieldDescriptor.Type.SINT32 | FieldDescriptor.Type.SFIXED32 => IntegerType
    case FieldDescriptor.Type.UINT32 | FieldDescriptor.Type.FIXED32 => LongType
    case FieldDescriptor.Type.INT64 | FieldDescriptor.Type.SINT64 | FieldDescriptor.Type.SFIXED64 => LongType
    case FieldDescriptor.Type.UINT64 | FieldDescriptor.Type.FIXED64 => DecimalType(20, 0)
    case FieldDescriptor.Type.FLOAT => FloatType
    case FieldDescriptor.Type.DOUBLE => DoubleType
    case FieldDescriptor.Type.BOOL => BooleanType
    case FieldDescriptor.Type.STRING => StringType
    case FieldDescriptor.Type.BYTES => BinaryType
    case FieldDescriptor.Type.ENUM => StringType
    case _ =>
      val m = f.getMessageType
      if (m.getFullName == TIMESTAMP) TimestampType
      else if (WRAPPERS.contains(m.getFullName)) scalar(m.findFieldByName("value"), seen)
      else structOf(m, seen)
  }

  // --- decoding ------------------------------------------------------------------------------------------------

  /** The Confluent message indexes at the start of `in` ([0] when the first varint is 0). */
  private def readIndexes(in: CodedInputStream): Seq[Int] = {
    val count = in.readSInt32()
    if (count == 0) Seq(0)
    else if (count < 0 || count > 64) throw new Undecodable(s"bad message index count $count")
    else (0 until count).map(_ => in.readSInt32())
  }

  /** `value` (a field's value in a message) as a value of Spark type `target`; Undecodable when the writer's field
    * cannot be read as that type. */
  private def convert(value: AnyRef, f: FieldDescriptor, target: DataType, path: String): Any = {
    if (f.isMapField) {
      target match {
        case MapType(kt, vt, _) =>
          val entry = f.getMessageType
          val (kf, vf) = (entry.findFieldByName("key"), entry.findFieldByName("value"))
          value.asInstanceOf[java.util.List[Message]].asScala.map { e =>
            convertOne(e.getField(kf), kf, kt, s"$path.key") -> valueOf(e, vf, vt, s"$path.value")
          }.toMap
        case other => mismatch(path, f, other)
      }
    } else if (f.isRepeated) {
      target match {
        case ArrayType(et, _) =>
          value.asInstanceOf[java.util.List[AnyRef]].asScala.toSeq.map(v => convertOne(v, f, et, path))
        case other => mismatch(path, f, other)
      }
    } else convertOne(value, f, target, path)
  }

  /** The value of field `f` of `m` as `target`, null when absent (a field with presence). */
  private def valueOf(m: Message, f: FieldDescriptor, target: DataType, path: String): Any = {
    if (!f.isRepeated && f.hasPresence && !m.hasField(f)) null
    else convert(m.getField(f), f, target, path)
  }

  /** Message `m` as a row of `s`: each field by name, null where `m`'s type has no such field. */
  private def recordOf(m: Message, s: StructType, path: String): Row = {
    val d = m.getDescriptorForType
    Row.fromSeq(s.fields.toSeq.map { field =>
      Option(d.findFieldByName(field.name)).map(w => valueOf(m, w, field.dataType, s"$path.${field.name}")).orNull
    })
  }

  private def convertOne(value: AnyRef, f: FieldDescriptor, target: DataType, path: String): Any = {
    (f.getType, value, target) match {
      case (_, m: Message, _) if m.getDescriptorForType.getFullName == TIMESTAMP =>
        val d = m.getDescriptorForType
        val instant = Instant.ofEpochSecond(m.getField(d.findFieldByName("seconds")).asInstanceOf[java.lang.Long],
          m.getField(d.findFieldByName("nanos")).asInstanceOf[Integer].longValue)
        target match {
          case TimestampType => instant
          case TimestampNTZType => LocalDateTime.ofInstant(instant, ZoneOffset.UTC)
          case other => mismatch(path, f, other)
        }
      case (_, m: Message, _) if WRAPPERS.contains(m.getDescriptorForType.getFullName) =>
        val inner = m.getDescriptorForType.findFieldByName("value")
        convertOne(m.getField(inner), inner, target, path)
      case (_, m: Message, s: StructType) => recordOf(m, s, path)
      case (FieldDescriptor.Type.UINT32 | FieldDescriptor.Type.FIXED32, i: Integer, LongType | _: DecimalType) =>
        widen(Integer.toUnsignedLong(i), target)
      case (FieldDescriptor.Type.UINT64 | FieldDescriptor.Type.FIXED64, l: java.lang.Long, _: DecimalType) =>
        new JBigDecimal(new BigInteger(java.lang.Long.toUnsignedString(l)))
      case (FieldDescriptor.Type.UINT32 | FieldDescriptor.Type.FIXED32 | FieldDescriptor.Type.UINT64 |
            FieldDescriptor.Type.FIXED64, _, other) => mismatch(path, f, other)
      case (_, i: Integer, IntegerType) => i
      case (_, i: Integer, DateType) => LocalDate.ofEpochDay(i.longValue)
      case (_, i: Integer, LongType | _: DecimalType | DoubleType) => widen(i.longValue, target)
      case (_, l: java.lang.Long, LongType) => l
      case (_, l: java.lang.Long, _: DecimalType | DoubleType) => widen(l.longValue, target)
      case (_, v: java.lang.Float, FloatType) => v
      case (_, v: java.lang.Float, DoubleType) => v.doubleValue
      case (_, v: java.lang.Double, DoubleType) => v
      case (_, v: java.lang.Boolean, BooleanType) => v
      case (_, v: String, StringType) => v
      case (_, v: String, d: DecimalType) =>
        try new JBigDecimal(v).setScale(d.scale) catch {
          case _: NumberFormatException | _: ArithmeticException => throw new Undecodable(s"field $path: '$v' is not a decimal of scale ${d.scale}")
        }
      case (_, v: ByteString, BinaryType) => v.toByteArray
      case (_, v: EnumValueDescriptor, StringType) => v.getName
      case (_, _, other) => mismatch(path, f, other)
    }
  }

  private def widen(v: Long, target: DataType): Any = target match {
    case LongType => v
    case DoubleType => v.toDouble
    case _: DecimalType => JBigDecimal.valueOf(v)
    case other => throw new IllegalStateException(s"no widening of a long to $other")
  }

  private def mismatch(path: String, f: FieldDescriptor, target: DataType): Nothing = {
    val have = try typeOf(f, Nil).simpleString catch { case _: IllegalArgumentException => f.getType.toString }
    throw new Undecodable(s"field $path is $have in its schema, ${target.simpleString} in the newest one")
  }

  /** Decodes a Kafka value (or key) column: a struct of the record as `reader` (null when it cannot be decoded) and
    * the reason (null when it could). `sets(i)` is the FileDescriptorSet of schema id `ids(i)`, `files(i)` the name
    * of its main file. */
  class Decoder(sets: Array[Array[Byte]], ids: Array[Int], fileNames: Array[String], reader: StructType, subject: String)
      extends UDF1[Array[Byte], Row] {

    @transient private lazy val byId: Map[Int, FileDescriptor] =
      ids.indices.map(i => ids(i) -> files(sets(i))(fileNames(i))).toMap

    override def call(value: Array[Byte]): Row = {
      if (value == null) return Row(null, TOMBSTONE)
      if (value.length < 5 || value(0) != 0) return Row(null, NOT_WIRE)
      val id = ByteBuffer.wrap(value, 1, 4).getInt
      val file = byId.getOrElse(id, null)
      if (file == null) return Row(null, s"undecodable: schema id $id is not a version of subject '$subject'")
      try {
        val in = CodedInputStream.newInstance(value, 5, value.length - 5)
        val indexes = try readIndexes(in) catch {
          case e: InvalidProtocolBufferException => throw new Undecodable(s"bad message indexes (${e.getMessage})")
        }
        val message = messageAt(file, indexes).getOrElse(
          throw new Undecodable(s"message indexes ${indexes.mkString("[", ",", "]")} name no message of schema id $id"))
        val record = try DynamicMessage.parseFrom(message, in) catch {
          case _: InvalidProtocolBufferException =>
            throw new Undecodable(s"not Protobuf of its schema (id $id, message ${message.getFullName})")
        }
        Row(recordOf(record, reader, "value"), null)
      } catch {
        case e: Undecodable => Row(null, s"undecodable: ${e.getMessage}")
      }
    }
  }

  /** The decoding column of `value` (see Decoder); its type: struct<record: reader, error: string>. */
  def decode(value: Column, sets: java.util.List[Array[Byte]], ids: java.util.List[Integer],
             fileNames: java.util.List[String], readerJson: String, subject: String): Column = {
    val reader = DataType.fromJson(readerJson).asInstanceOf[StructType]
    val decoder = new Decoder(sets.asScala.toArray, ids.asScala.map(_.intValue).toArray, fileNames.asScala.toArray,
      reader, subject)
    val out = StructType(Seq(StructField("record", reader), StructField("error", StringType)))
    functions.udf(decoder, out).apply(value)
  }

  // --- encoding ------------------------------------------------------------------------------------------------

  /** Encodes a struct column as message `message` of `file` in `set`, behind the wire format's header with schema id
    * `schemaId`. A null struct stays null (a tombstone). */
  class Encoder(set: Array[Byte], fileName: String, messageName: String, schemaId: Int, input: StructType)
      extends UDF1[Row, Array[Byte]] {

    @transient private lazy val descriptor: Descriptor = messageNamed(files(set)(fileName), messageName)
    @transient private lazy val header: Array[Byte] = {
      val indexes = indexesOf(descriptor)
      val buffer = new java.io.ByteArrayOutputStream()
      buffer.write(0)
      buffer.write(ByteBuffer.allocate(4).putInt(schemaId).array())
      val out = com.google.protobuf.CodedOutputStream.newInstance(buffer)
      if (indexes == Seq(0)) out.writeSInt32NoTag(0)
      else { out.writeSInt32NoTag(indexes.size); indexes.foreach(out.writeSInt32NoTag) }
      out.flush()
      buffer.toByteArray
    }

    override def call(row: Row): Array[Byte] = {
      if (row == null) return null
      header ++ message(descriptor, row, input).toByteArray
    }
  }

  private def message(d: Descriptor, row: Row, struct: StructType): Message = {
    val builder = DynamicMessage.newBuilder(d)
    struct.fields.zipWithIndex.foreach { case (field, i) =>
      val f = d.findFieldByName(field.name)
      if (f != null && !row.isNullAt(i)) {
        val v = row.get(i)
        if (f.isMapField) {
          val entry = f.getMessageType
          field.dataType match {
            case MapType(kt, vt, _) =>
              v.asInstanceOf[scala.collection.Map[Any, Any]].foreach { case (k, x) =>
                val e = DynamicMessage.newBuilder(entry)
                e.setField(entry.findFieldByName("key"), protoValue(entry.findFieldByName("key"), k, kt))
                if (x != null) e.setField(entry.findFieldByName("value"), protoValue(entry.findFieldByName("value"), x, vt))
                builder.addRepeatedField(f, e.build())
              }
            case other => throw new IllegalArgumentException(s"column ${field.name} ($other) is not a map")
          }
        } else if (f.isRepeated) {
          val et = field.dataType.asInstanceOf[ArrayType].elementType
          v.asInstanceOf[scala.collection.Seq[Any]].foreach { x =>
            if (x == null) {
              throw new IllegalArgumentException(
                s"column ${field.name} holds a null array element, which a repeated Protobuf field cannot hold")
            }
            builder.addRepeatedField(f, protoValue(f, x, et))
          }
        } else builder.setField(f, protoValue(f, v, field.dataType))
      }
    }
    builder.build()
  }

  private def protoValue(f: FieldDescriptor, v: Any, t: DataType): AnyRef = (t, v) match {
    case (_: StructType, r: Row) => message(f.getMessageType, r, t.asInstanceOf[StructType])
    case (TimestampType | TimestampNTZType, _) =>
      val instant = v match {
        case ts: java.sql.Timestamp => ts.toInstant
        case i: Instant => i
        case l: LocalDateTime => l.toInstant(ZoneOffset.UTC)
        case other => throw new IllegalArgumentException(s"not a timestamp: $other")
      }
      val d = f.getMessageType
      DynamicMessage.newBuilder(d)
        .setField(d.findFieldByName("seconds"), java.lang.Long.valueOf(instant.getEpochSecond))
        .setField(d.findFieldByName("nanos"), Integer.valueOf(instant.getNano)).build()
    case (DateType, d: java.sql.Date) => Integer.valueOf(d.toLocalDate.toEpochDay.toInt)
    case (DateType, d: LocalDate) => Integer.valueOf(d.toEpochDay.toInt)
    case (_: DecimalType, d: JBigDecimal) => d.toPlainString
    case (_: DecimalType, d: scala.math.BigDecimal) => d.bigDecimal.toPlainString
    case (BinaryType, b: Array[Byte]) => ByteString.copyFrom(b)
    case (ShortType, s: java.lang.Short) => Integer.valueOf(s.intValue)
    case (ByteType, b: java.lang.Byte) => Integer.valueOf(b.intValue)
    case (_, x: AnyRef) => x
    case (_, x) => throw new IllegalArgumentException(s"no Protobuf value for $x of $t")
  }

  /** The encoding column of struct column `struct` (see Encoder). */
  def encode(struct: Column, set: Array[Byte], fileName: String, messageName: String, schemaId: Int,
             inputJson: String): Column = {
    val input = DataType.fromJson(inputJson).asInstanceOf[StructType]
    functions.udf(new Encoder(set, fileName, messageName, schemaId, input), BinaryType).apply(struct)
  }
}
