/*
 * Hadoop's shell (FsShell) as a keytab user: for reading a kerberized cluster back with Hadoop's
 * own client, independently of Ferry. FsShell has no keytab option and a JVM reads no keytab by
 * itself, so this logs in first:
 *
 *   java -Djava.security.krb5.conf=CONF/krb5.conf -cp "CONF:$(cat "$FERRY_MINIDFS_CLASSPATH_FILE")" \
 *        ferry.KeytabShell PRINCIPAL KEYTAB [FsShell arguments, e.g. -get /table /tmp/copy]
 *
 * CONF (first on the classpath) is a kerberized MiniDfs's --conf-dir: its core-site.xml and
 * hdfs-site.xml carry the client's security settings. Exit code: FsShell's.
 */
package ferry;

import java.util.Arrays;

import org.apache.hadoop.fs.FsShell;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.security.UserGroupInformation;
import org.apache.hadoop.util.ToolRunner;

public final class KeytabShell {
  public static void main(String[] argv) throws Exception {
    if (argv.length < 3) {
      System.err.println("usage: ferry.KeytabShell PRINCIPAL KEYTAB FSSHELL-ARGS...");
      System.exit(2);
    }
    HdfsConfiguration conf = new HdfsConfiguration();
    conf.set("hadoop.security.authentication", "kerberos");
    UserGroupInformation.setConfiguration(conf);
    UserGroupInformation.loginUserFromKeytab(argv[0], argv[1]);
    System.exit(ToolRunner.run(new FsShell(conf), Arrays.copyOfRange(argv, 2, argv.length)));
  }

  private KeytabShell() {}
}
