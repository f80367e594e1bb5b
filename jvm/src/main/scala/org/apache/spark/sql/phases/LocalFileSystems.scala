package org.apache.spark.sql.phases

import java.io.File
import java.net.URI
import java.nio.file.Files
import java.nio.file.attribute.PosixFilePermission

import scala.jdk.CollectionConverters._

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{ChecksumFs, DelegateToFileSystem, FileStatus, FsConstants, FsServerDefaults, LocalFileSystem, Path, RawLocalFileSystem}
import org.apache.hadoop.fs.local.LocalConfigKeys
import org.apache.hadoop.fs.permission.FsPermission

/**
 * Hadoop's local file system without a process per call.
 *
 * Without Hadoop's native library (pip's PySpark has none), `RawLocalFileSystem` runs `chmod` for the permission of
 * every file it creates and `readlink` for the link status that `FileContext.rename` asks of both paths and of their
 * `.crc` files. Spark's checkpoint files and state store files, and Delta's commits (`HDFSLogStore`), are written
 * through `FileContext` as a temporary file renamed into place: about 40 processes a live micro-batch, ~5 ms each.
 *
 * These classes give the same answers in-process: the permission bits through `java.nio` (a sticky bit, which
 * `java.nio` cannot set, still goes to Hadoop's `chmod`), and the link status of a path that is not a symbolic link
 * as Hadoop's own code returns it then (`readlink` printed nothing, so it returns `getFileStatus`). A symbolic link
 * still takes Hadoop's code. Everything else (rename without overwrite, the `.crc` files, listing) is Hadoop's.
 * A local session sets `fs.file.impl` and `fs.AbstractFileSystem.file.impl` to them (phases/runtime/session.py);
 * tests/phases/test_local_file_systems.py pins that they answer as Hadoop's own and start no process.
 */
class RawLocalFileSystemWithoutShell extends RawLocalFileSystem {

  override def setPermission(p: Path, permission: FsPermission): Unit = {
    if (permission.getStickyBit) super.setPermission(p, permission)
    else Files.setPosixFilePermissions(pathToFile(p).toPath, LocalFileSystems.posix(permission.toShort))
  }

  override def getFileLinkStatus(f: Path): FileStatus = {
    // Hadoop reads the link of `new File(f.toString)` (for a qualified path, a relative name beginning "file:").
    if (Files.isSymbolicLink(new File(f.toString).toPath)) super.getFileLinkStatus(f) else getFileStatus(f)
  }
}

/** `fs.file.impl`: Hadoop's `LocalFileSystem` (with its `.crc` files) over [[RawLocalFileSystemWithoutShell]]. */
class LocalFileSystemWithoutShell extends LocalFileSystem(new RawLocalFileSystemWithoutShell)

/** `FileContext`'s raw local file system (Hadoop's `RawLocalFs`) over [[RawLocalFileSystemWithoutShell]]. */
class RawLocalFsWithoutShell(uri: URI, conf: Configuration)
    extends DelegateToFileSystem(uri, new RawLocalFileSystemWithoutShell, conf, FsConstants.LOCAL_FS_URI.getScheme, false) {

  def this(conf: Configuration) = this(FsConstants.LOCAL_FS_URI, conf)

  override def getUriDefaultPort: Int = -1

  override def getServerDefaults(f: Path): FsServerDefaults = LocalConfigKeys.getServerDefaults()

  @deprecated("as Hadoop's", "")
  override def getServerDefaults(): FsServerDefaults = LocalConfigKeys.getServerDefaults()

  override def isValidName(src: String): Boolean = true
}

/** `fs.AbstractFileSystem.file.impl`: Hadoop's `LocalFs` (checksummed) over [[RawLocalFsWithoutShell]]. */
class LocalFsWithoutShell(uri: URI, conf: Configuration) extends ChecksumFs(new RawLocalFsWithoutShell(uri, conf)) {
  def this(conf: Configuration) = this(FsConstants.LOCAL_FS_URI, conf)
}

object LocalFileSystems {
  private val Bits: Seq[(Int, PosixFilePermission)] = Seq(
    0x100 -> PosixFilePermission.OWNER_READ,
    0x80 -> PosixFilePermission.OWNER_WRITE,
    0x40 -> PosixFilePermission.OWNER_EXECUTE,
    0x20 -> PosixFilePermission.GROUP_READ,
    0x10 -> PosixFilePermission.GROUP_WRITE,
    0x8 -> PosixFilePermission.GROUP_EXECUTE,
    0x4 -> PosixFilePermission.OTHERS_READ,
    0x2 -> PosixFilePermission.OTHERS_WRITE,
    0x1 -> PosixFilePermission.OTHERS_EXECUTE)

  /** The `java.nio` permissions of the mode bits 0777 of `mode` (what `chmod` sets from them). */
  def posix(mode: Short): java.util.Set[PosixFilePermission] =
    Bits.collect { case (bit, p) if (mode & bit) != 0 => p }.toSet.asJava
}
